"""Header reads that start before the index is in (sources/header_reads.py): only for a complete set of
shard names, and the index stays the authority on which headers count. Runs in fresh interpreters (the
index child, which makes the early reads possible, forks only while single-threaded)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT  # noqa: E402
from hub_repos import make_sharded_repo  # noqa: E402
from hub_server_process import ServerProcess  # noqa: E402

from ckptinspect.sources.header_reads import EARLY_ENV, shard_set, typical_size  # noqa: E402

INDEX = "model.safetensors.index.json"


def _report(ref: str, home: Path, url: str | None = None, early: bool = True) -> tuple[int, dict | str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "XDG_CACHE_HOME", "CKPTINSPECT_DEBUG")}
    env.update(HF_HOME=str(home), PYTHONPATH=str(ROOT), **{EARLY_ENV: "1" if early else "0"})
    if url is not None:
        env["HF_ENDPOINT"] = url
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "report", ref, "--format", "json", "--quiet"],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT), env=env)
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode in (0, 1) else proc.stderr)


def _body(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "source"}


def test_shard_set_is_one_complete_set_of_shard_names():
    shards = [f"model-{i:05d}-of-00003.safetensors" for i in (3, 1, 2)]
    assert shard_set(shards + ["config.json", "consolidated.safetensors", "original/x-00001-of-00001.safetensors"]) \
        == sorted(shards)
    assert shard_set(shards[:2]) == []  # one missing: the index may name anything
    assert shard_set(shards + ["other-00001-of-00001.safetensors"]) == []  # two sets
    assert shard_set(shards + ["model-00004-of-00003.safetensors"]) == []  # an index past the count
    assert shard_set(shards + ["model-0001-of-00003.safetensors"]) == []  # index 1 twice
    assert shard_set(["model.safetensors"]) == []


def test_files_of_atypical_size_wait_for_the_index():
    sizes = {"a": 2_500, "b": 2_400, "c": 2_600, "d": 18_000, "e": 1_000, "f": 1_700}
    assert typical_size(list(sizes), sizes) == ["a", "b", "c", "f"]  # median 2,500: 1,667 to 3,750
    assert typical_size(["a", "x"], {"a": 10, "x": None}) == ["a", "x"]  # a size unknown: no basis


def test_every_header_is_asked_for_before_the_index_is_in(tmp_path):
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=5, experts=8)
    # The index answers after 3 s: every header GET is logged (answered) before it.
    with ServerProcess({"org/r": root}, faults=(("timeout", INDEX, 1),)) as server:
        code, early = _report("org/r", tmp_path / "a", server.url)
        log = server.stats()["log"]
    assert code == 0, early
    paths = [entry[1] for entry in log]
    index_at = next(i for i, path in enumerate(paths) if path.endswith(INDEX))
    assert sum(path.endswith(".safetensors") for path in paths[:index_at]) == 5
    assert early["source"]["stats"]["headers_before_index"] == 5
    code, local = _report(str(root), tmp_path / "l")
    assert _body(early) == _body(local)


def test_a_file_the_index_does_not_name_is_dropped_with_its_errors(tmp_path):
    """The set is complete (4 of 4), the index names 3: the fourth, read early, has a header the parser
    rejects, and the report is still the local one (which never reads it): an unindexed-shard finding."""
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=4, experts=8)
    index = json.loads((root / INDEX).read_text())
    fourth = "model-00004-of-00004.safetensors"
    index["weight_map"] = {n: s for n, s in index["weight_map"].items() if s != fourth}
    index["metadata"].pop("total_size")
    (root / INDEX).write_text(json.dumps(index))
    with open(root / fourth, "r+b") as fh:
        fh.write(struct.pack("<Q", 2 ** 40))  # a length prefix past the end of the file
    with ServerProcess({"org/r": root}) as server:
        code, hub = _report("org/r", tmp_path / "a", server.url)
    assert code in (0, 1), hub
    assert hub["source"]["stats"]["headers_before_index"] == 4
    code, local = _report(str(root), tmp_path / "l")
    assert _body(hub) == _body(local)
    assert any(f["code"] == "unindexed-shard" and fourth in f["message"] for f in hub["findings"])


def test_a_shard_outside_the_set_is_read_once_the_index_names_it(tmp_path):
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=3, experts=8)
    index = json.loads((root / INDEX).read_text())
    moved = "model-00003-of-00003.safetensors"
    (root / moved).rename(root / "extra.safetensors")
    index["weight_map"] = {n: ("extra.safetensors" if s == moved else s) for n, s in index["weight_map"].items()}
    (root / INDEX).write_text(json.dumps(index))
    with ServerProcess({"org/r": root}) as server:
        code, hub = _report("org/r", tmp_path / "a", server.url)
        code_off, off = _report("org/r", tmp_path / "b", server.url, early=False)
    assert code == code_off == 0, (hub, off)
    assert hub["source"]["stats"]["headers_before_index"] == 0  # 1 and 2 of 3 is not a complete set
    assert off["source"]["stats"]["headers_before_index"] == 0
    code, local = _report(str(root), tmp_path / "l")
    assert _body(hub) == _body(local) == _body(off)


@pytest.mark.parametrize("early", [True, False])
def test_switch_turns_early_reads_off(tmp_path, early):
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=3, experts=8)
    with ServerProcess({"org/r": root}) as server:
        code, doc = _report("org/r", tmp_path / "a", server.url, early=early)
    assert code == 0, doc
    assert doc["source"]["stats"]["headers_before_index"] == (3 if early else 0)
