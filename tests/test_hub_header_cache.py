"""The Hub header cache (sources/header_cache.py) against the test Hub server (tests/hub_server.py) with
huggingface_hub's own client: a second read of the same commit asks for the repo info only; a changed
commit or etag reads again; a damaged entry is a miss with the same answer; the cap evicts; concurrent
writers are safe; the report JSON is the same with and without the cache; HF_HUB_OFFLINE is unchanged."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import NotFoundError  # noqa: E402
from ckptinspect.sources import header_cache  # noqa: E402
from ckptinspect.sources.header_cache import HeaderCache, entry_key  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402
from ckptinspect.settings import Settings  # noqa: E402

REPO = "org/tiny"
SHA = "a" * 40
ETAG = "b" * 64


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    monkeypatch.setenv("CKPTINSPECT_CACHE_DIR", str(tmp_path / "ck"))
    monkeypatch.delenv("CKPTINSPECT_HEADER_CACHE", raising=False)
    monkeypatch.delenv("CKPTINSPECT_HEADER_CACHE_MAX_BYTES", raising=False)


@pytest.fixture()
def server():
    with HubServer() as srv:
        yield srv


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repos" / "tiny"
    return root, make_sharded_repo(root, shards=3, experts=8)


def _ours(server: HubServer) -> list[tuple]:
    # huggingface_hub 2.x may refresh its user-agent registry (/api/agent-harnesses) on its own.
    return [e[:4] for e in server.stats()["log"] if not e[1].startswith("/api/agent-harnesses")]


def _entries(tmp_path: Path) -> list[Path]:
    root = tmp_path / "ck" / "hub-headers"
    return sorted(root.glob("*.hdr")) if root.is_dir() else []


def _read(server: HubServer, **kw) -> object:
    """open_hub with the settings the CLI would build from the variables the test set (cache directory,
    switch, size)."""
    return open_hub(REPO, endpoint=server.url, progress=False, settings=Settings.from_environ(), **kw)


def test_second_read_of_the_same_commit_asks_for_the_repo_info_only(server, repo, tmp_path):
    root, headers = repo
    server.add_repo(REPO, root)
    first = _read(server)
    assert first.stats["headers_from_cache"] == 0
    assert len(_entries(tmp_path)) == 3
    server.reset_stats()
    second = _read(server)
    assert _ours(server) == [("GET", f"/api/models/{REPO}?blobs=True", None, 200)]
    assert second.stats["headers_from_cache"] == 3 and second.stats["json_from_cache"] == len(first.json_files)
    assert dict(second.headers) == dict(first.headers) == headers
    assert list(second.headers) == list(first.headers)  # index order, as without the cache
    assert second.file_sizes == first.file_sizes and second.revision == first.revision


def test_switched_off_by_env_and_by_option(server, repo, tmp_path, monkeypatch):
    root, headers = repo
    server.add_repo(REPO, root)
    monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE", "0")
    _read(server)
    assert _entries(tmp_path) == []
    monkeypatch.delenv("CKPTINSPECT_HEADER_CACHE")
    _read(server)  # stores
    server.reset_stats()
    raw = _read(server, header_cache=False)
    assert raw.stats["headers_from_cache"] == 0
    assert len(_ours(server)) == 1 + 3 * 2  # info + a redirected GET per shard
    assert dict(raw.headers) == headers


def test_a_new_commit_on_the_branch_reads_the_headers_again(server, repo, tmp_path):
    root, headers = repo
    server.add_repo(REPO, root)
    _read(server)
    new_root = tmp_path / "repos" / "tiny2"
    new_headers = make_sharded_repo(new_root, shards=3, experts=12)  # same shard names, other headers
    record = server._repos[REPO]
    record.revisions["main"] = new_root
    record.commits["main"] = "c" * 40
    server.reset_stats()
    raw = _read(server)
    assert raw.revision == "c" * 40
    assert raw.stats["headers_from_cache"] == 0
    assert dict(raw.headers) == new_headers != headers
    assert sum(1 for e in _ours(server) if e[1].startswith("/cdn/")) == 3


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap", "oversized", "empty", "directory", "prefix"])
def test_a_damaged_entry_is_a_miss_with_the_same_answer(server, repo, tmp_path, damage):
    root, headers = repo
    server.add_repo(REPO, root)
    clean = _read(server, header_cache=False)
    _read(server)
    entries = _entries(tmp_path)
    victim = entries[0]
    blob = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(blob[:-5] + bytes([blob[-5] ^ 1]) + blob[-4:])
    elif damage == "truncate":
        victim.write_bytes(blob[: len(blob) // 2])
    elif damage == "swap":  # another shard's (valid) entry under this key's name
        shutil.copyfile(entries[1], victim)
    elif damage == "oversized":  # bigger than any entry may be: never read in
        with open(victim, "ab") as f:
            f.truncate(header_cache.MAX_HEADER_LENGTH + (1 << 20))
    elif damage == "empty":
        victim.write_bytes(b"")
    elif damage == "directory":
        victim.unlink()
        victim.mkdir()
    elif damage == "prefix":  # checksum recomputed over a payload whose length prefix lies
        import hashlib
        import struct

        key_len = struct.unpack(">I", blob[8:12])[0]
        key = blob[12:12 + key_len]
        payload = blob[12 + key_len + 32:]
        bad = struct.pack("<Q", len(payload) - 16) + payload[8:]
        victim.write_bytes(blob[:12 + key_len] + hashlib.sha256(key + bad).digest() + bad)
    server.reset_stats()
    raw = _read(server)
    assert raw.stats["headers_from_cache"] == 2
    assert sum(1 for e in _ours(server) if e[1].startswith("/cdn/")) == 1  # the damaged one read again
    assert dict(raw.headers) == dict(clean.headers) == headers
    if damage != "directory":  # stored anew: a third read asks for no header
        server.reset_stats()
        assert _read(server).stats["headers_from_cache"] == 3
        assert len(_ours(server)) == 1


def _cache(root: Path, limit: int | None = None) -> HeaderCache:
    """A header cache under ``root`` with a per-user key (cache_auth.py): without a key file nothing is stored
    or looked up. The key lies outside the cache's parent directory, as cache_auth requires, beside the
    test's own temporary folder."""
    return HeaderCache(root, limit, key_file=root.parent.parent / f"{root.parent.name}.cache-key")


def test_entry_key_pins_commit_etag_and_size_and_drops_userinfo():
    key = entry_key("http://hub.local:8080/", REPO, SHA, "a.safetensors", ETAG, 1000)
    assert key == entry_key("http://user:secret@hub.local:8080", REPO, SHA, "a.safetensors", ETAG, 1000)
    assert b"secret" not in key
    others = [entry_key("http://hub.local:8080", REPO, "d" * 40, "a.safetensors", ETAG, 1000),
              entry_key("http://hub.local:8080", REPO, SHA, "a.safetensors", "e" * 64, 1000),
              entry_key("http://hub.local:8080", REPO, SHA, "a.safetensors", ETAG, 1001),
              entry_key("http://hub.local:8080", REPO, SHA, "b.safetensors", ETAG, 1000),
              entry_key("http://other:8080", REPO, SHA, "a.safetensors", ETAG, 1000),
              entry_key("http://hub.local:8080", "org/other", SHA, "a.safetensors", ETAG, 1000)]
    assert None not in others and len({key, *others}) == 7
    # Not pinned: a branch name, a missing or odd etag, an unknown size: never a key.
    assert entry_key("http://h", REPO, "main", "a.safetensors", ETAG, 1000) is None
    assert entry_key("http://h", REPO, "", "a.safetensors", ETAG, 1000) is None
    assert entry_key("http://h", REPO, SHA, "a.safetensors", None, 1000) is None
    assert entry_key("http://h", REPO, SHA, "a.safetensors", "../../x", 1000) is None
    assert entry_key("http://h", REPO, SHA, "a.safetensors", ETAG, None) is None


def test_the_cap_evicts_least_recently_used_first(tmp_path):
    cache = _cache(tmp_path / "c", limit=10_000)
    keys = [entry_key("http://h", REPO, SHA, f"s{i}.safetensors", ETAG, 10**6) for i in range(4)]
    for i, key in enumerate(keys[:3]):
        cache.put(key, b"{" + b" " * 2_998 + b"}")
        os.utime(cache._path(key), (1_000 + i, 1_000 + i))
    assert cache.get(keys[0]) is not None  # a hit makes entry 0 the most recently used
    cache.put(keys[3], b"{" + b" " * 2_998 + b"}")
    kept = cache.evict()
    assert kept <= 10_000
    assert [cache.get(k) is not None for k in keys] == [True, False, True, True]  # entry 1 was oldest


def test_the_cap_from_the_environment_bounds_a_hub_read(server, repo, tmp_path, monkeypatch):
    root, headers = repo
    server.add_repo(REPO, root)
    sizes = sorted(8 + len(h) for h in headers.values())
    monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE_MAX_BYTES", str(sizes[-1] + sizes[-2] + 1000))
    raw = _read(server)
    assert dict(raw.headers) == headers
    kept = _entries(tmp_path)
    assert 1 <= len(kept) <= 2
    assert sum(p.stat().st_size for p in kept) <= sizes[-1] + sizes[-2] + 1000
    server.reset_stats()
    again = _read(server)
    assert again.stats["headers_from_cache"] == len(kept)
    assert dict(again.headers) == headers


def test_concurrent_writers_of_the_same_entry_leave_one_whole_entry(tmp_path):
    key = entry_key("http://h", REPO, SHA, "s.safetensors", ETAG, 10**6)
    header = json.dumps({"__metadata__": {"format": "pt"}, "w": {"dtype": "BF16", "shape": [2],
                                                                  "data_offsets": [0, 4]}}).encode()
    seen: list[bytes | None] = []

    def work() -> None:
        cache = _cache(tmp_path / "c")
        for _ in range(40):
            cache.put(key, header)
            seen.append(cache.get(key))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen) <= {header, None} and header in seen  # never a partial or other answer
    assert [p.name for p in (tmp_path / "c").iterdir()] == [_cache(tmp_path / "c")._path(key).name]


def test_concurrent_hub_reads_share_the_cache_safely(server, repo, tmp_path):
    root, headers = repo
    server.add_repo(REPO, root)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(_read(server))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(dict(r.headers) == headers for r in results)
    assert len(_entries(tmp_path)) == 3 and not list((tmp_path / "ck" / "hub-headers").glob(".*"))
    server.reset_stats()
    assert _read(server).stats["headers_from_cache"] == 3 and len(_ours(server)) == 1


def test_report_json_is_the_same_with_and_without_the_cache(server, repo, monkeypatch):
    import ckptinspect
    from ckptinspect.render.json_out import report_to_json

    root, _ = repo
    server.add_repo(REPO, root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE", "0")
    without = report_to_json(ckptinspect.inspect(REPO))
    monkeypatch.delenv("CKPTINSPECT_HEADER_CACHE")
    stored = report_to_json(ckptinspect.inspect(REPO))
    server.reset_stats()
    cached = report_to_json(ckptinspect.inspect(REPO))
    assert len(_ours(server)) == 1  # the report was built from the cache
    # source.stats measures the run (wall time, requests, headers_from_cache): everything else is the answer.
    assert cached["source"].pop("stats")["headers_from_cache"] == 3
    assert stored["source"].pop("stats")["headers_from_cache"] == 0
    without["source"].pop("stats")
    assert cached == stored == without


def test_offline_mode_is_unchanged_by_the_header_cache(server, repo, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 never asks the Hub, and the header cache alone cannot answer: the file list,
    sizes and etags come from the repo info, which offline mode may not ask for."""
    import ckptinspect

    root, _ = repo
    server.add_repo(REPO, root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    ckptinspect.inspect(REPO)
    assert len(_entries(tmp_path)) == 3
    server.reset_stats()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
    with pytest.raises(NotFoundError, match="HF_HUB_OFFLINE"):
        ckptinspect.inspect(REPO)
    assert _ours(server) == []


def test_a_header_longer_than_the_file_the_key_names_is_a_miss(tmp_path):
    """A stored header must fit in the file the key pins (8 + n <= size), as the reader checks online."""
    cache = _cache(tmp_path / "c")
    header = b'{"__metadata__":{"format":"pt"}}'
    short = entry_key("http://h", REPO, SHA, "s.safetensors", ETAG, 8 + len(header) - 1)
    fits = entry_key("http://h", REPO, SHA, "s.safetensors", ETAG, 8 + len(header))
    cache.put(short, header)
    cache.put(fits, header)
    assert cache.get(short) is None and cache.get(fits) == header


def _write_and_read(args: tuple[str, bytes, bytes]) -> list[bytes | None]:
    root, key, header = args
    cache = _cache(Path(root))
    got = []
    for _ in range(30):
        cache.put(key, header)
        got.append(cache.get(key))
    return got


def test_concurrent_processes_writing_the_same_entry_leave_one_whole_entry(tmp_path):
    import multiprocessing

    key = entry_key("http://h", REPO, SHA, "s.safetensors", ETAG, 10**6)
    header = b'{"__metadata__":{"format":"pt"}' + b" " * 50_000 + b"}"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        seen = [x for got in pool.map(_write_and_read, [(str(tmp_path / "c"), key, header)] * 3) for x in got]
    assert set(seen) <= {header, None} and seen.count(header) >= 1
    assert [p.name for p in (tmp_path / "c").iterdir()] == [_cache(tmp_path / "c")._path(key).name]
    assert _cache(tmp_path / "c").get(key) == header



def test_access_with_a_warm_cache_is_decided_by_the_repo_info_as_for_huggingface_hub(server, repo, tmp_path):
    """The repo-info call comes before any lookup: a repo the Hub no longer shows (private, deleted) is an
    error with a warm cache. A gated repo's info is public on the Hub (and on the test server), and its
    files are gated: cached headers of a pinned commit are then used without a new access check, as
    huggingface_hub's ``hf_hub_download`` returns a cached file of a commit hash without a request
    (file_download.py ``_hf_hub_download_to_cache_dir``, "shortcut everything")."""
    from ckptinspect.errors import AccessError

    root, headers = repo
    server.add_repo(REPO, root, gated_token="hf_granted")
    with pytest.raises(AccessError):
        _read(server, token="hf_other")  # cold: the header GETs answer 403
    assert dict(_read(server, token="hf_granted").headers) == headers
    assert len(_entries(tmp_path)) == 3
    server.reset_stats()
    warm = _read(server, token="hf_other")
    assert warm.stats["headers_from_cache"] == 3 and dict(warm.headers) == headers
    assert _ours(server) == [("GET", f"/api/models/{REPO}?blobs=True", None, 200)]
    del server._repos[REPO]  # gone (or private) on the Hub: the warm cache answers nothing
    with pytest.raises(NotFoundError):
        _read(server, token="hf_granted")
