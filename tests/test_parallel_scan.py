"""The forked header scan (inventory/parallel.py) against the in-process scan, and its failure paths.

Every test forks real worker processes over real fixture files; the only substitutions are wrappers
around the per-shard scan function (named where used) that record or fail, inherited by the forks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import ckptinspect.inventory.parallel as parallel
from ckptinspect.errors import CkptInspectError
from ckptinspect.sources import open_source
from fixtures.families_misc import llama_bf16
from fixtures.generate import write_fixture
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(os.name != "posix", reason="worker processes are forked on POSIX only")


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama layout spread over 11 shards (with its index)."""
    spec = llama_bf16("llama_many_shards", 16)  # 16 requested; the tiny layout fills 11
    assert len(spec.shards) >= 10
    return write_fixture(spec, tmp_path_factory.mktemp("parallel"))


def _shard_count(path: Path) -> int:
    return len(list(path.glob("*.safetensors")))


def _scan(path: Path, workers: int, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(parallel.WORKERS_ENV, str(workers))
    return parallel.scan_checkpoint(open_source(str(path), progress=False))


def _comparable(scans) -> list:
    return [(s.shard, s.header_length, s.file_size, s.tensors, s.data_bytes, s.name_hash, s.groups) for s in scans]


@pytest.mark.parametrize("workers,max_tokens", [(2, 512), (3, 512), (5, 512), (3, 4)])
def test_forked_scan_equals_in_process_scan(workers, max_tokens, many_shards, monkeypatch):
    """Same scans in index order and the same index summary, with 1-4 workers and with pipe numbers
    that stand for runs of shards (max_tokens 4: 11 shards -> 4 runs of 3 or 2)."""
    serial, serial_summary = _scan(many_shards, 1, monkeypatch)
    monkeypatch.setattr(parallel, "_MAX_TOKENS", max_tokens)
    forked, summary = _scan(many_shards, workers, monkeypatch)
    assert len(serial) == _shard_count(many_shards) and summary is not None
    assert summary == serial_summary
    assert _comparable(forked) == _comparable(serial)


def test_each_shard_is_scanned_by_exactly_one_process(many_shards, monkeypatch, tmp_path):
    """The shared pipe of shard numbers hands every shard to one process, and more than one process
    takes part. Recording wrapper (inherited by the forks): each scan appends "pid shard" to a log."""
    log = tmp_path / "scans.log"
    real = parallel.scan_header_unpaused

    def recording(shard, data, size):
        time.sleep(0.01)  # slow enough that every process gets shards
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} {shard}\n")
        return real(shard, data, size)

    monkeypatch.setattr(parallel, "scan_header_unpaused", recording)
    scans, _ = _scan(many_shards, 3, monkeypatch)
    lines = [line.split() for line in log.read_text().splitlines()]
    shards = [shard for _, shard in lines]
    assert sorted(shards) == sorted(s.shard for s in scans) and len(set(shards)) == len(shards) == _shard_count(many_shards)
    assert len({pid for pid, _ in lines}) >= 2


def _break_header(path: Path) -> None:
    """Give the shard's first tensor an unknown dtype (same header length, data kept)."""
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"BF16"')
    raw[at:at + 6] = b'"XF16"'
    path.write_bytes(bytes(raw))


def test_the_error_names_the_first_bad_shard_in_index_order_whoever_scans_it(many_shards, tmp_path):
    """Two broken shards: 1, 2 or 3 processes all report the one the index lists first."""
    broken = tmp_path / "two_broken"
    shutil.copytree(many_shards, broken)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shards = list(dict.fromkeys(index["weight_map"].values()))
    _break_header(broken / shards[3])
    _break_header(broken / shards[-1])
    lines = set()
    for workers in ("1", "2", "3"):
        result = run_cli("report", str(broken), "--quiet", env={parallel.WORKERS_ENV: workers})
        assert result.returncode == 2 and "Traceback" not in result.stderr
        lines.add(result.stderr.strip())
    assert len(lines) == 1
    (line,) = lines
    assert shards[3] in line and "unknown dtype" in line


def test_a_broken_file_the_index_does_not_name_is_ignored_on_both_paths(many_shards, tmp_path):
    """Engines load what the index names; an extra broken .safetensors file is an info finding for
    the in-process and the forked scan alike (the forked scan reads it early, then drops it)."""
    extra = tmp_path / "extra_file"
    shutil.copytree(many_shards, extra)
    (extra / "zz-leftover.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    docs = []
    for workers in ("1", "2"):
        result = run_cli("report", str(extra), "--format", "json", env={parallel.WORKERS_ENV: workers})
        assert result.returncode == 0, result.stderr
        docs.append(json.loads(result.stdout))
    assert docs[0] == docs[1]
    assert "unindexed-shard" in {f["code"] for f in docs[0]["findings"]}


def _in_children_only(action):
    """A scan-function replacement that runs ``action`` in forked workers and scans normally in the parent
    (slowly, so the workers get shards)."""
    parent = os.getpid()
    real = parallel.scan_header_unpaused

    def replacement(shard, data, size):
        if os.getpid() != parent:
            action()
        time.sleep(0.02)
        return real(shard, data, size)

    return replacement


def test_a_worker_that_dies_is_a_one_line_error(many_shards, monkeypatch):
    monkeypatch.setattr(parallel, "scan_header_unpaused", _in_children_only(lambda: os._exit(7)))
    with pytest.raises(CkptInspectError, match="worker process ended without its results"):
        _scan(many_shards, 2, monkeypatch)


def test_a_bug_in_a_worker_keeps_its_type_and_traceback(many_shards, monkeypatch):
    def bug():
        raise ZeroDivisionError("bug in the scan")

    monkeypatch.setattr(parallel, "scan_header_unpaused", _in_children_only(bug))
    with pytest.raises(ZeroDivisionError, match="bug in the scan") as caught:
        _scan(many_shards, 2, monkeypatch)
    assert any("raised in a scan worker process" in note and "bug" in note for note in caught.value.__notes__)


def test_a_failure_in_the_parent_stops_and_reaps_the_workers(many_shards, monkeypatch):
    """The parent reads config and rules while the workers scan; if that fails, no worker outlives it."""
    monkeypatch.setenv(parallel.WORKERS_ENV, "3")
    monkeypatch.setattr(parallel, "scan_header_unpaused", _in_children_only(lambda: time.sleep(5)))
    with pytest.raises(RuntimeError, match="config failed"):
        with parallel.start_scan(open_source(str(many_shards), progress=False)) as scan:
            pids = [pid for pid, _ in scan.children]
            assert len(pids) == 2
            raise RuntimeError("config failed")
    for pid in pids:
        with pytest.raises(ChildProcessError):  # already reaped: no zombie left behind
            os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "65", "٣"])
def test_a_bad_worker_count_is_a_one_line_error(value, many_shards):
    result = run_cli("report", str(many_shards), "--quiet", env={parallel.WORKERS_ENV: value})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: {parallel.WORKERS_ENV}={value!r} must be a whole number from 1 to 64"



def test_nothing_to_share_scans_in_process_whatever_the_worker_count(many_shards, tmp_path, monkeypatch):
    """No weights at all, one file, or a source whose headers are already scanned (the Hub) never fork,
    and a source's own scans are used as they are."""
    from dataclasses import replace

    from ckptinspect.records import ScanPlan

    monkeypatch.setenv(parallel.WORKERS_ENV, "3")
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    shutil.copy(many_shards / "config.json", config_only / "config.json")
    one_file = write_fixture(llama_bf16("llama_one_file", 1), tmp_path)
    for path in (config_only, one_file):
        assert parallel.process_count(open_source(str(path), progress=False)) == 1
    results = [run_cli("report", str(config_only), "--format", "json", env={parallel.WORKERS_ENV: n}) for n in "13"]
    assert results[0].returncode == results[1].returncode == 0 and results[0].stdout == results[1].stdout
    assert "no-weights" in {f["code"] for f in json.loads(results[0].stdout)["findings"]}

    raw = open_source(str(many_shards), progress=False)
    serial, _ = _scan(many_shards, 1, monkeypatch)
    prescanned = replace(raw, scan_plan=ScanPlan(early={}, header_bytes=10 ** 9, scanned={s.shard: s for s in serial}))
    monkeypatch.setenv(parallel.WORKERS_ENV, "3")
    assert parallel.process_count(prescanned) == 1
    scans, _ = parallel.scan_checkpoint(prescanned)
    assert all(a is b for a, b in zip(scans, serial)) and len(scans) == len(serial)
