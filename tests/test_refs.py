"""References as people type them (issue 26 item 6), each through the CLI as a user runs it: the exit
code and, for a mistake, the one error line.

The Hub forms are answered by tests/hub_server.py (a real HTTP server on 127.0.0.1 that huggingface_hub's
own client talks to), so a URL that normalised to the wrong repo or revision reads the wrong checkpoint
and the test sees it in the report (`source`, `totals`), not in a restated parse. The unit table of
refs.normalize_ref is in tests/test_user_conventions.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT  # noqa: E402
from hub_server import HubServer  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def gguf_quants(tmp_path_factory):
    """A GGUF repo folder: two quants (one in a folder, split in two) and a projector."""
    pytest.importorskip("gguf")
    from fixtures.gguf_models import MODELS, write_model

    root = tmp_path_factory.mktemp("gguf-repo")
    write_model(MODELS["GLM-4.5-Air-Q4_K_M"], root)
    write_model(MODELS["GLM-4.5-Air-Q8_0"], root / "Q8_0")
    (root / "mmproj-F16.gguf").write_bytes((root / "GLM-4.5-Air-Q4_K_M.gguf").read_bytes()[:4096])
    return root


@pytest.fixture(scope="module")
def hub(make_fixture, gguf_quants):
    """org/name at main (DeepSeek NVFP4) and at `dev` (the same family without MTP), and a GGUF repo."""
    server = HubServer()
    server.add_repo("org/name", make_fixture("deepseek_v3_nvfp4"),
                    revisions={"dev": make_fixture("deepseek_v3_nvfp4_nomtp")})
    server.add_repo("org/GLM-GGUF", gguf_quants)
    with server:
        yield server


def _cli(*args: str, hub: HubServer | None = None, home: Path, offline: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CKPTINSPECT_DEBUG", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_HUB_CACHE")}
    env.update(HF_HOME=str(home), CKPTINSPECT_HEADER_CACHE="0", CKPTINSPECT_HTTP_BACKOFF_S="0.01",
               HF_HUB_DISABLE_PROGRESS_BARS="1")
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    # a generous bound: only a guard against a hang, not a claim about speed
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def _report(ref: str, *extra: str, **kwargs) -> dict:
    res = _cli("report", ref, "--format", "json", *extra, **kwargs)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.fixture(scope="module")
def hub_reports(hub, tmp_path_factory):
    """`report` of the two revisions by repo id: what every URL form must reproduce."""
    home = tmp_path_factory.mktemp("hf-home")
    return {rev: _report("org/name" if rev == "main" else f"org/name@{rev}", hub=hub, home=home)
            for rev in ("main", "dev")}


# -- the HF cache folder, pasted as a path ---------------------------------------------------------
def _cache_repo(tmp_path: Path, source: Path, *, commits=(COMMIT,), ref_main: str | None = COMMIT) -> Path:
    folder = tmp_path / "hub" / "models--org--name"
    for commit in commits:
        shutil.copytree(source, folder / "snapshots" / commit)
    (folder / "blobs").mkdir()
    if ref_main is not None:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(ref_main + "\n")
    return folder


@pytest.mark.parametrize("typed", ["models--org--name", "models--org--name/snapshots",
                                   f"models--org--name/snapshots/{COMMIT}"])
def test_an_hf_cache_folder_pasted_as_a_path_reads_its_snapshot(typed, tmp_path, make_fixture):
    folder = _cache_repo(tmp_path, make_fixture("deepseek_v3_nvfp4"))
    direct = _report(str(make_fixture("deepseek_v3_nvfp4")), home=tmp_path / "home")
    doc = _report(str(folder.parent / typed), home=tmp_path / "home", offline=True)
    assert doc["source"]["kind"] == "local"
    assert doc["source"]["location"] == str(folder / "snapshots" / COMMIT)
    assert (doc["totals"], doc["mtp"]) == (direct["totals"], direct["mtp"])


def test_an_hf_cache_folder_of_several_snapshots_without_refs_main_asks_for_one(tmp_path, make_fixture):
    other = "f" * 40
    folder = _cache_repo(tmp_path, make_fixture("deepseek_v3_nvfp4"), commits=(COMMIT, other), ref_main=None)
    line = _one_error_line(_cli("report", str(folder), home=tmp_path / "home", offline=True))
    assert "2 snapshots and no refs/main" in line and COMMIT in line and f"{folder}/snapshots/COMMIT" in line


# -- a mistyped relative path that looks like org/name ---------------------------------------------
@pytest.mark.parametrize("online", [True, False], ids=["hub-404", "offline"])
def test_a_mistyped_path_that_looks_like_a_repo_id_says_no_directory_either(online, hub, tmp_path):
    res = _cli("report", "mymodels/qwen-nvfp4", hub=hub if online else None, home=tmp_path, offline=not online)
    line = _one_error_line(res)
    assert line.startswith("error: mymodels/qwen-nvfp4: ") and "no local directory of that name either" in line
    assert ("not found, private or gated? check the spelling" in line) if online else ("HF_HUB_OFFLINE=1" in line)


# -- Hub URLs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("typed, rev", [
    ("https://huggingface.co/org/name", "main"),
    ("https://huggingface.co/org/name/", "main"),
    ("https://huggingface.co/org/name/tree/main", "main"),
    ("https://huggingface.co/org/name/tree/dev", "dev"),
    ("https://huggingface.co/org/name/blob/dev/config.json", "dev"),
    ("https://huggingface.co/org/name/resolve/main/model.safetensors.index.json?download=true", "main"),
    ("https://hf.co/org/name", "main"),
    ("huggingface.co/org/name/tree/dev", "dev"),
    ("hf://org/name", "main"),
    ("hf://org/name@dev", "dev"),
    ("hf://org/name@dev/config.json", "dev"),
])
def test_a_hub_url_reads_the_repo_and_revision_it_names(typed, rev, hub, hub_reports, tmp_path):
    doc = _report(typed, hub=hub, home=tmp_path)
    assert doc["source"]["kind"] == "hub" and doc["source"]["ref"].split("@")[0] == "org/name"
    assert doc["source"]["revision"] == hub_reports[rev]["source"]["revision"]  # the commit read
    assert doc["totals"] == hub_reports[rev]["totals"] and doc["mtp"] == hub_reports[rev]["mtp"]


@pytest.mark.parametrize("typed, says", [
    ("https://huggingface.co/datasets/org/name", "is a Hub dataset, not a model repo"),
    ("https://huggingface.co/spaces/org/name", "is a Hub space, not a model repo"),
    ("https://huggingface.co/org", "a Hub URL names a repo as org/name"),
])
def test_a_hub_url_that_is_not_a_model_repo_is_one_error_line(typed, says, hub, tmp_path):
    line = _one_error_line(_cli("report", typed, hub=hub, home=tmp_path))
    assert line.startswith(f"error: {typed}: {says}"), line


# -- a revision given twice ---------------------------------------------------------------------------
@pytest.mark.parametrize("typed", ["org/name@dev", "https://huggingface.co/org/name/tree/dev", "hf://org/name@dev"])
def test_a_revision_given_twice_must_agree(typed, hub, hub_reports, tmp_path):
    line = _one_error_line(_cli("report", typed, "--revision", "v2", hub=hub, home=tmp_path))
    assert "pins revision 'dev' but --revision says 'v2'" in line
    agreed = _report(typed, "--revision", "dev", hub=hub, home=tmp_path)
    assert agreed["totals"] == hub_reports["dev"]["totals"]


# -- GGUF ---------------------------------------------------------------------------------------------
def _gguf_model(doc: dict) -> str:
    assert doc["format"] == "gguf", doc["format"]
    return doc["source"]["stats"]["model_set"]


def test_a_gguf_file_and_a_missing_one(gguf_quants, tmp_path):
    doc = _report(str(gguf_quants / "GLM-4.5-Air-Q4_K_M.gguf"), home=tmp_path)
    assert _gguf_model(doc) == "GLM-4.5-Air-Q4_K_M" and doc["shards"]["count"] == 1
    line = _one_error_line(_cli("report", str(tmp_path / "typo-Q4_K_M.gguf"), home=tmp_path))
    assert line == f"error: {tmp_path / 'typo-Q4_K_M.gguf'}: no such GGUF file"


@pytest.mark.parametrize("typed, quant", [
    ("org/GLM-GGUF:Q8_0", "Q8_0"),
    ("hf.co/org/GLM-GGUF:Q8_0", "Q8_0"),  # Ollama's way of naming a Hub GGUF
    ("https://huggingface.co/org/GLM-GGUF/blob/main/GLM-4.5-Air-Q4_K_M.gguf", "Q4_K_M"),
    ("https://huggingface.co/org/GLM-GGUF/resolve/main/Q8_0/GLM-4.5-Air-Q8_0-00002-of-00003.gguf", "Q8_0"),
    ("hf://org/GLM-GGUF/Q8_0/GLM-4.5-Air-Q8_0-00001-of-00003.gguf", "Q8_0"),
])
def test_a_gguf_repo_reference_reads_the_quant_it_names(typed, quant, hub, tmp_path):
    doc = _report(typed, hub=hub, home=tmp_path)
    assert doc["source"]["kind"] == "hub" and _gguf_model(doc).endswith(f"GLM-4.5-Air-{quant}")
    assert doc["shards"]["count"] == (3 if quant == "Q8_0" else 1)


@pytest.mark.parametrize("typed", ["org/GLM-GGUF", "https://huggingface.co/org/GLM-GGUF"])
def test_a_gguf_repo_without_a_quant_lists_them_in_one_line(typed, hub, tmp_path):
    line = _one_error_line(_cli("report", typed, hub=hub, home=tmp_path))
    assert "holds 2 GGUF models; pick one with :TAG" in line and "Q4_K_M" in line and "Q8_0" in line


def test_an_hf_cache_folder_of_a_gguf_repo_reads_the_gguf(gguf_quants, tmp_path):
    folder = tmp_path / "hub" / "models--org--GLM-GGUF"
    shutil.copytree(gguf_quants, folder / "snapshots" / COMMIT)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    line = _one_error_line(_cli("report", str(folder), home=tmp_path, offline=True))
    assert "holds 2 GGUF models; pick one with :TAG" in line
    doc = _report(f"{folder}/snapshots/{COMMIT}/Q8_0/GLM-4.5-Air-Q8_0-00001-of-00003.gguf", home=tmp_path,
                  offline=True)
    assert _gguf_model(doc) == "GLM-4.5-Air-Q8_0" and doc["shards"]["count"] == 3

