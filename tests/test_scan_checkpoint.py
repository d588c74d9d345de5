"""The one scan (inventory/scan.py ``scan_checkpoint``) for every source, in this thread: a Hub read and a
local read of the same checkpoint report the same, errors name the first bad shard in index order
whichever source read it, an index naming other tensors is found alike, and a local report starts no
thread and no process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ckptinspect.errors import CkptInspectError, HeaderError
from ckptinspect.pipeline import build_report
from ckptinspect.settings import Settings
from ckptinspect.render.json_out import dumps, report_to_json
from fixtures.families_misc import llama_bf16
from fixtures.generate import write_fixture

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf  # noqa: E402
from hub_server import HubServer  # noqa: E402


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(llama_bf16("llama_many_shards", 16), tmp_path_factory.mktemp("scan"))


def _json(ref: str) -> str:
    """The report JSON less where it was read from (location, kind, request timings), or the error's line."""
    try:
        doc = report_to_json(build_report(ref, progress=False, settings=Settings.from_environ()))  # as the CLI reads it
    except CkptInspectError as exc:
        return f"{type(exc).__name__}: {exc}"
    doc.pop("source", None)
    return dumps(doc)


def _break_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b'"BF16"')
    data[at:at + 6] = b'"XX16"'
    path.write_bytes(bytes(data))


def _through_hub(monkeypatch: pytest.MonkeyPatch, home: Path, repos: dict[str, Path]) -> dict[str, str]:
    isolate_hf(monkeypatch, home)
    with HubServer() as server:
        for repo, path in repos.items():
            server.add_repo(repo, path)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE", "0")
        return {repo: _json(repo) for repo in repos}


def test_the_hub_and_a_local_directory_report_the_same(make_fixture, many_shards, tmp_path, monkeypatch):
    repos = {"org/many": many_shards, "org/moe": make_fixture("qwen3_5_moe_nvfp4"),
             "org/dsv3": make_fixture("deepseek_v3_fp8")}
    here = {repo: _json(str(path)) for repo, path in repos.items()}
    there = _through_hub(monkeypatch, tmp_path / "hf", repos)
    assert there == here
    assert all(json.loads(doc)["totals"]["tensors"] > 0 for doc in here.values())


def test_the_first_bad_shard_in_index_order_is_named_through_the_hub(many_shards, tmp_path, monkeypatch):
    broken = tmp_path / "two_broken"
    shutil.copytree(many_shards, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shards = list(dict.fromkeys(index["weight_map"].values()))
    _break_header(broken / shards[3])
    _break_header(broken / shards[-1])
    with pytest.raises(HeaderError) as raised:
        build_report(str(broken), progress=False)
    assert shards[3] in str(raised.value) and "unknown dtype" in str(raised.value)
    there = _through_hub(monkeypatch, tmp_path / "hf", {"org/broken": broken})["org/broken"]
    assert there.startswith("HeaderError") and shards[3] in there and shards[-1] not in there


def test_an_index_naming_other_tensors_is_found_alike(many_shards, tmp_path, monkeypatch):
    """The cross-check by fingerprint: a same-count, same-length rename in the index (only the names'
    fingerprint tells) is reported by the local and the Hub read alike."""
    renamed = tmp_path / "renamed"
    shutil.copytree(many_shards, renamed)
    path = renamed / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    name = next(n for n in index["weight_map"] if "q_proj" in n)
    index["weight_map"][name.replace("q_proj", "k_qrox")] = index["weight_map"].pop(name)
    path.write_text(json.dumps(index))
    here = _json(str(renamed))
    assert "index-header-mismatch" in here
    assert _through_hub(monkeypatch, tmp_path / "hf", {"org/renamed": renamed})["org/renamed"] == here


def test_a_local_report_starts_no_thread_and_no_process(many_shards, monkeypatch):
    """Spies (the real calls still run): Thread.start and Popen are recorded, none may happen."""
    started: list[str] = []
    real_start, real_popen = threading.Thread.start, subprocess.Popen.__init__

    def start(self, *args, **kwargs):
        started.append(f"thread {self.name}")
        return real_start(self, *args, **kwargs)

    def popen(self, *args, **kwargs):
        started.append(f"process {args[:1]}")
        return real_popen(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    doc = json.loads(_json(str(many_shards)))
    assert doc["totals"]["tensors"] > 0 and started == []
