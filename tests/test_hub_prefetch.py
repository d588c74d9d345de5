"""The index prefetch (sources/index_prefetch.py): a child process reads and summarizes the index while
the parent starts up. The reader forks only while single-threaded, and a pytest worker carries threads
left by other tests' in-process servers, so the reads here run as users run them: the CLI (or a short
script) in a fresh interpreter, against the test Hub server in its own process."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT  # noqa: E402
from hub_repos import make_sharded_repo  # noqa: E402
from hub_server_process import ServerProcess  # noqa: E402

from ckptinspect.sources import index_prefetch  # noqa: E402
from ckptinspect.sources.header_reads import EARLY_ENV  # noqa: E402
from ckptinspect.sources.hub import PREFETCH_ENV  # noqa: E402
from ckptinspect.sources.index_prefetch import IndexPrefetch  # noqa: E402

REPO = "org/tiny"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo") / "tiny"
    headers = make_sharded_repo(root, shards=4, experts=16)
    with ServerProcess({REPO: root}) as server:
        yield server, root, headers


def _env(server, home: Path, prefetch: bool) -> dict[str, str]:
    """The whole environment of a fresh run: this Hub, an empty HF_HOME, no token, online."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "XDG_CACHE_HOME", "CKPTINSPECT_DEBUG")}
    return {**env, "HF_ENDPOINT": server.url, "HF_HOME": str(home), PREFETCH_ENV: "1" if prefetch else "0",
            "PYTHONPATH": str(ROOT)}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=str(ROOT), env=env)


def _report(server, home: Path, prefetch: bool, early: bool = True) -> tuple[dict, dict]:
    """``early``: header reads may start before the index is in (sources/header_reads.py), which the
    index child makes possible; off, the requests depend only on where the index is read."""
    server.reset_stats()
    env = {**_env(server, home, prefetch), EARLY_ENV: "1" if early else "0"}
    proc = _run(["-m", "ckptinspect", "report", REPO, "--format", "json", "--quiet"], env)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout), server.stats()


def _fresh(code: str, env: dict[str, str]) -> object:
    """Run ``code`` in a new interpreter (single-threaded, as the CLI); it prints one JSON value."""
    proc = _run(["-c", code], env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_report_is_the_same_with_the_index_read_by_the_child(served, tmp_path):
    server, _, _ = served
    fetched, stats = _report(server, tmp_path / "a", prefetch=True, early=False)
    serial, serial_stats = _report(server, tmp_path / "b", prefetch=False)

    assert fetched["source"]["stats"]["index_prefetched"] is True
    assert serial["source"]["stats"]["index_prefetched"] is False
    for doc in (fetched, serial):
        del doc["source"]["stats"]
    assert fetched == serial
    # The child's GET replaces the parent's: the same requests and bytes reach the server.
    assert stats["requests"] == serial_stats["requests"] and stats["bytes"] == serial_stats["bytes"]
    assert [e[1] for e in stats["log"] if e[1].endswith(INDEX)] == [f"/{REPO}/resolve/main/{INDEX}"]


def test_child_stores_the_index_in_the_hf_cache(served, tmp_path):
    server, root, _ = served
    home = tmp_path / "home"
    _report(server, home, prefetch=True)
    cached = list((home / "hub" / "models--org--tiny" / "snapshots").glob(f"*/{INDEX}"))
    assert len(cached) == 1 and cached[0].is_symlink() and cached[0].read_bytes() == (root / INDEX).read_bytes()
    again, stats = _report(server, home, prefetch=True)  # now from the cache: no child, no index GET
    assert again["source"]["stats"]["index_prefetched"] is False
    assert not [e for e in stats["log"] if e[1].endswith(INDEX)]


def test_a_failed_read_in_the_child_falls_back_to_the_parent(tmp_path):
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=2, experts=8)
    with ServerProcess({REPO: root}, faults=(("5xx", INDEX, 1),)) as server:
        doc, stats = _report(server, tmp_path / "home", prefetch=True)
    assert doc["source"]["stats"]["index_prefetched"] is False
    assert doc["totals"]["tensors"] == len(json.loads((root / INDEX).read_text())["weight_map"])
    index_gets = [e for e in stats["log"] if e[1].endswith(INDEX)]
    assert [e[3] for e in index_gets] == [503, 206]  # the child's one attempt, then the parent's read


def test_snapshot_of_a_prefetched_read_holds_the_whole_index(served, tmp_path):
    server, root, _ = served
    out = tmp_path / "s.json.gz"
    proc = _run(["-m", "ckptinspect", "snapshot", REPO, "-o", str(out), "--quiet"],
                _env(server, tmp_path / "h", prefetch=True))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["json_files"][INDEX] == json.loads((root / INDEX).read_text())


def test_answer_for_another_commit_or_a_failed_read_is_not_used(served, tmp_path):
    server, _, _ = served
    code = f"""
import json
from ckptinspect.sources.index_prefetch import IndexPrefetch
out = []
for repo, commit in (("{REPO}", "0" * 40), ("org/absent", "0" * 40)):
    p = IndexPrefetch.start("{server.url}", repo, None, None, timeout=10)
    out.append([p is not None, p.result(commit, wait_s=30) is None])
    p.close()
print(json.dumps(out))
"""
    # moved branch (another commit), then a 404 in the child: both started, neither answer used
    assert _fresh(code, _env(server, tmp_path / "h", prefetch=True)) == [[True, True], [True, True]]


def test_a_read_leaves_no_thread_so_the_next_read_can_fork(served, tmp_path):
    server, _, headers = served
    code = f"""
import json, threading
from ckptinspect.sources.hub import open_hub
runs = []
for progress in (False, True):  # tqdm starts a monitor thread for any bar unless told not to
    raw = open_hub("{REPO}", endpoint="{server.url}", progress=progress)
    runs.append([raw.stats["index_prefetched"], threading.active_count(), len(raw.headers)])
print(json.dumps(runs))
"""
    runs = _fresh(code, _env(server, tmp_path / "h", prefetch=True))
    assert runs == [[True, 1, len(headers)], [False, 1, len(headers)]]  # the second found the index cached


def test_no_fork_while_other_threads_run(served):
    server, _, _ = served
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert IndexPrefetch.start(server.url, REPO, None, None, timeout=10) is None
    finally:
        stop.set()
        worker.join()


def test_token_lookup_without_importing_huggingface_hub(tmp_path, monkeypatch):
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("hf_from_file\n")
    monkeypatch.setenv("HF_TOKEN_PATH", str(token_file))
    assert index_prefetch._token(None) == "hf_from_file"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert index_prefetch._token(None) == "hf_from_env"
    assert index_prefetch._token("hf_explicit") == "hf_explicit"
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    assert index_prefetch._token(None) is None


@pytest.mark.parametrize("source", ["memfd", "pipe", "none"])
def test_cache_store_copies_from_the_childs_file_or_writes_the_bytes(tmp_path, monkeypatch, source):
    """The index child hands its memory file to cache_store (a kernel copy); a source that cannot be
    copied from (a pipe) falls back to writing the bytes: the blob is the same either way."""
    from ckptinspect.sources.hf_cache import cache_store, cached_file

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    data = os.urandom(3_000_000)
    fd = None
    if source == "memfd":
        fd = os.memfd_create("t")
        os.pwrite(fd, data, 0)
    elif source == "pipe":
        fd, write_end = os.pipe()
        os.close(write_end)
    try:
        cache_store(REPO, "c" * 40, "main", INDEX, data, "e" * 64, source_fd=fd)
    finally:
        if fd is not None:
            os.close(fd)
    cached = cached_file(REPO, "c" * 40, INDEX)
    assert cached is not None and cached.read_bytes() == data
    assert not list((tmp_path / "hub").rglob("*.incomplete"))
