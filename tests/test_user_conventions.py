"""What users type and where output goes (issue 26 items 6, 8, 9): Hub URLs, hf:// and HF cache folders
as references, a revision given twice, a mistyped path that looks like org/name; text to a pipe not
wrapped at a guessed 80 columns; "did you mean" for commands; the group's options after the command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptinspect.errors import SourceError
from ckptinspect.refs import normalize_ref

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("CKPTINSPECT_DEBUG", "COLUMNS")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=REPO,
                          env=full, timeout=120)


@pytest.mark.parametrize("typed, ref", [
    ("https://huggingface.co/org/name", "org/name"),
    ("https://huggingface.co/org/name/tree/dev", "org/name@dev"),
    ("https://huggingface.co/org/name/blob/main/config.json", "org/name"),
    ("hf://org/name", "org/name"),
    ("hf://org/name@v1", "org/name@v1"),
    ("org/name", "org/name"),
])
def test_hub_urls_become_repo_ids(typed, ref):
    assert normalize_ref(typed) == (ref, None)


def test_a_revision_given_twice_must_agree():
    assert normalize_ref("org/name@v1", "v1") == ("org/name@v1", "v1")
    with pytest.raises(SourceError, match="pins revision 'v1' but --revision says 'v2'"):
        normalize_ref("org/name@v1", "v2")
    r = _cli("report", "org/name@v1", "--revision", "v2")
    assert r.returncode == 2 and "--revision says 'v2'" in r.stderr


def test_an_hf_cache_repo_folder_reads_its_main_snapshot(tmp_path, make_fixture):
    from ckptinspect import api

    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = tmp_path / "hub" / "models--org--name"
    shutil.copytree(make_fixture("deepseek_v3_nvfp4"), folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit + "\n")
    (folder / "blobs").mkdir()
    direct = api.inspect(str(folder / "snapshots" / commit))
    for typed in (folder, folder / "snapshots"):
        report = api.inspect(str(typed))
        assert report.checkpoint.location == direct.checkpoint.location
        assert report.mtp.verdicts == direct.mtp.verdicts


def test_a_mistyped_path_that_looks_like_a_repo_id_says_so(tmp_path):
    r = _cli("report", "mymodels/qwen-nvfp4", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 2 and "no local directory of that name either" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_text_to_a_pipe_is_not_wrapped_at_80_columns(make_fixture, tmp_path):
    import shutil

    path = tmp_path / "model"  # with a tokenizer file: the payoff section prints the probe command then
    shutil.copytree(make_fixture("deepseek_v3_nvfp4_mtp_fp4"), path)
    (path / "tokenizer.json").write_text('{"model": {"vocab": {}}}', encoding="utf-8")
    piped = _cli("report", str(path))
    assert piped.returncode == 0 and max(map(len, piped.stdout.splitlines())) > 100
    # the probe command of the payoff section is whole on one line
    assert any("ckptinspect probe" in line and "--gpu YOUR_GPU`" in line for line in piped.stdout.splitlines())
    narrow = _cli("report", str(path), env={"COLUMNS": "80"})
    assert max(map(len, narrow.stdout.splitlines())) <= 80


def test_unknown_command_suggests_the_closest():
    r = _cli("reprot", "x")
    assert r.returncode == 2 and "did you mean 'report'" in r.stderr
    r = _cli("frobnicate")
    assert r.returncode == 2 and "commands: report" in r.stderr


def test_network_options_after_the_command(make_fixture):
    r = _cli("report", str(make_fixture("deepseek_v3_nvfp4")), "--deadline", "30", "--request-timeout=10", "-q")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("smi, catalog", [
    ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell"),
    ("NVIDIA GeForce RTX 5090", "RTX-5090"),
    ("NVIDIA B300 SXM6 AC", "B300"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_nvidia_smi_names_are_accepted(smi, catalog):
    """What `nvidia-smi --query-gpu=name` / rocm-smi print (issue 26 item 7)."""
    from ckptinspect.plan.gpus import find_gpu

    assert find_gpu(smi).name == catalog


@pytest.mark.parametrize("typed", ["NVIDIA H100 NVL", "NVIDIA H200 NVL", "h100-nvl", "h300"])
def test_another_card_is_never_suggested(typed):
    """H100 NVL (94 GB) is neither an H100 SXM nor an H200: unknown, and no suggestion names another card."""
    from ckptinspect.errors import PlanError
    from ckptinspect.plan.gpus import find_gpu

    with pytest.raises(PlanError):
        find_gpu(typed)
    r = _cli("plan", "x", "--gpu", typed, "--gpus", "8")
    assert r.returncode == 2 and "unknown GPU" in r.stderr and "did you mean" not in r.stderr, r.stderr


def test_spelling_variants_are_still_suggested():
    r = _cli("plan", "x", "--gpu", "rtx-6000-pro", "--gpus", "8")
    assert r.returncode == 2 and "did you mean" in r.stderr and "rtx-pro-6000" in r.stderr
