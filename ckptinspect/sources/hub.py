"""Read a checkpoint's metadata from the Hugging Face Hub (or any Hub-compatible endpoint) without
downloading weights: the file list, the small JSON files, and every shard's safetensors header.

Round trips, for a repo of S shards: 1 (model info with blob metadata: file list, sizes, commit) + one GET
per small JSON file that is not yet in the HF cache + S header GETs, in parallel over keep-alive
connections. On a cold cache the index GET is made by a child process forked first thing, so its
download and parse overlap this process's start-up and repo-info call (sources/index_prefetch.py).
huggingface_hub's ``get_safetensors_metadata`` asks every shard for ``bytes=0-100000`` and needs a second
GET for every header over 99,992 bytes (hf_api.py ``parse_safetensors_file_metadata``); per-expert NVFP4 /
FP8 MoE shards are far above that. Here the first range is sized per shard (sources/header_reads.py):
from the index, or, while the index is still on its way, from the headers read so far, for the files
that form one complete set of shard names; the index then decides which headers count. A second GET
happens only for the remainder when a prediction falls short. Each header is scanned as it arrives, in
a helper process (sources/scan_ahead.py), when the caller passes the report's scan function.

Small JSON files go through the HF cache layout (``models--org--name/blobs`` + ``snapshots/<commit>``), so
a later run, ``HF_HUB_OFFLINE=1`` and huggingface_hub itself find them. They are fetched with one GET each
instead of ``hf_hub_download``'s HEAD + GET because the model-info call already returned their blob ids.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any, Callable, Mapping
from urllib.parse import quote

from ckptinspect.errors import ConfigError, NotFoundError
from ckptinspect.records import IndexSummary, RawCheckpoint, ScanPlan
from ckptinspect.sources import http_ranges
from ckptinspect.sources.header_reads import (HeaderReader, cancel, early_reads_enabled, shard_set,
                                              typical_size)
from ckptinspect.sources.http_ranges import FetchStats, RangeClient
from ckptinspect.sources.index_prefetch import IndexPrefetch
from ckptinspect.sources.hf_cache import cache_store, cached_file, describe_cache_gap, resolve_commit
from ckptinspect.sources.index_summary import summarize_index
from ckptinspect.sources.offline import hub_offline
from ckptinspect.sources.interface import (INDEX as INDEX_FILE, JSON_FILES, LazyJson, json_file_cap, parse_json_bytes,
                                           read_file_bytes)
from ckptinspect.sources.net_limits import Budget, NetLimits
from ckptinspect.sources.repo_info import model_info
from ckptinspect.sources.scan_ahead import ScanAhead, ScanFn

# Concurrent header requests: 32 halves the waves of 16 on a 94-shard repo at 20 ms per request
# (BENCHMARKS.md section 2); each thread keeps its own keep-alive connection.
DEFAULT_MAX_WORKERS = int(os.environ.get("CKPTINSPECT_MAX_WORKERS", "32"))
PREFETCH_ENV = "CKPTINSPECT_INDEX_PREFETCH"  # "0": read the index after the repo info, in this process
# How long to wait for the index child before reading the index here. Only a safety net: the child
# runs under the same deadline (what is left of it bounds the wait) and per-request limits.
PREFETCH_WAIT_S = 600.0
# How long to wait for the scan helper's answer once the parent has scanned its share: the helper is
# then at most one header behind. Past it the parent scans what the helper did not return.
SCAN_WAIT_S = 60.0


def hub_endpoint(endpoint: str | None = None) -> str:
    """The Hub endpoint: argument, else HF_ENDPOINT read now (not at import), else huggingface.co."""
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def download_timeout() -> float:
    """Seconds per socket read: HF_HUB_DOWNLOAD_TIMEOUT, default 10 (huggingface_hub's own default)."""
    return NetLimits.from_env().read_s


def open_hub(repo_id: str, *, revision: str | None = None, token: str | None = None,
             endpoint: str | None = None, progress: bool = True, max_workers: int | None = None,
             timeout: float | None = None, on_header: Callable[[str, bytes], None] | None = None,
             scan: ScanFn | None = None) -> RawCheckpoint:
    """Read ``repo_id`` at ``revision`` from the Hub: file list, small JSON files, every shard header.

    Args:
        repo_id: ``org/name``.
        revision: branch, tag or commit; default ``main``.
        token: access token; default HF_TOKEN / the saved login (huggingface_hub's rules).
        endpoint: Hub URL; default HF_ENDPOINT or https://huggingface.co.
        progress: tqdm bar on stderr for the header reads.
        max_workers: concurrent header requests (default 32, env CKPTINSPECT_MAX_WORKERS).
        timeout: seconds per socket read (default HF_HUB_DOWNLOAD_TIMEOUT, 10); the connect timeout,
            the per-request and whole-read deadlines and the byte budget come from the environment
            (sources/net_limits.py, docs/security.md).
        on_header: called from a worker thread with (shard, header bytes) as soon as each header is in,
            so a caller can parse while later headers are still on the wire (also for a file read before
            the index is in that the index then does not name).
        scan: the report's per-shard scan, ``scan(shard, header bytes, file size)``: run on each header
            as it arrives, in a helper process (sources/scan_ahead.py), and the results returned in
            ``scan_plan.scanned`` for every shard. None: headers only.

    Raises:
        NotFoundError: repo, revision or file missing, or HF_HUB_OFFLINE=1 (names what the cache lacks).
        AccessError: gated / private repo without a token that grants access.
        NetworkError: timeouts, 5xx, resets, broken ranges after bounded retries; the deadline or
            the byte budget of the whole read.
        HeaderError: a header length prefix over 25,000,000 bytes or beyond the file size.
    """
    if hub_offline():

        raise NotFoundError(f"HF_HUB_OFFLINE=1 and the HF cache cannot answer: {describe_cache_gap(repo_id, revision)}",
                            path=repo_id, hint="run once online, or use a .json.gz snapshot")
    started = time.perf_counter()
    endpoint = hub_endpoint(endpoint)
    limits = NetLimits.from_env(read_s=timeout)
    budget = Budget(limits)
    prefetch = _start_index_prefetch(endpoint, repo_id, revision, token, budget)
    ahead = ScanAhead.start(scan) if scan is not None else None  # forked while still single-threaded
    try:
        raw = _read_repo(repo_id, revision, token, endpoint, budget, progress, max_workers, on_header, prefetch,
                         started, ahead)
    except BaseException:
        if prefetch is not None:
            prefetch.close(kill=True)  # its answer is not wanted: do not wait for its download
        raise
    finally:
        if ahead is not None:
            ahead.close()
    if prefetch is not None:
        prefetch.close()
    return raw


def _start_index_prefetch(endpoint: str, repo_id: str, revision: str | None, token: str | None,
                          budget: Budget) -> IndexPrefetch | None:
    """Read the index in a child while this process starts up (sources/index_prefetch.py), unless the HF
    cache already holds it for the commit the revision last pointed to."""

    if os.environ.get(PREFETCH_ENV, "1").strip() == "0":
        return None
    commit = resolve_commit(repo_id, revision)
    if commit is not None and cached_file(repo_id, commit, INDEX_FILE) is not None:
        return None
    return IndexPrefetch.start(endpoint, repo_id, revision, token, budget.limits.read_s, budget=budget)


def _read_repo(repo_id: str, revision: str | None, token: str | None, endpoint: str, budget: Budget,
               progress: bool, max_workers: int | None, on_header: Callable[[str, bytes], None] | None,
               prefetch: IndexPrefetch | None, started: float, ahead: ScanAhead | None) -> RawCheckpoint:
    from huggingface_hub.utils import build_hf_headers

    stats = FetchStats()
    headers = build_hf_headers(token=token)
    client = RangeClient(repo_id, headers, timeout=budget.limits.read_s, stats=stats, budget=budget)
    try:
        return _read_with(client, repo_id, revision, endpoint, progress, max_workers, on_header, prefetch,
                          started, ahead)
    finally:
        client.close()


def _read_with(client: RangeClient, repo_id: str, revision: str | None, endpoint: str, progress: bool,
               max_workers: int | None, on_header: Callable[[str, bytes], None] | None,
               prefetch: IndexPrefetch | None, started: float, ahead: ScanAhead | None) -> RawCheckpoint:
    stats, budget = client.stats, client.budget
    info = model_info(client, endpoint, repo_id, revision)
    phases = {"info_s": time.perf_counter() - started}
    commit = info.sha or revision or "main"
    siblings = {s.rfilename: s for s in (info.siblings or [])}

    def url(filename: str) -> str:  # huggingface_hub's HUGGINGFACE_CO_URL_TEMPLATE, pinned to the commit
        return f"{endpoint}/{repo_id}/resolve/{quote(commit, safe='')}/{quote(filename)}"

    json_files: dict[str, Any] = {}
    workers = max(1, max_workers or DEFAULT_MAX_WORKERS)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        def fetch(name: str) -> Any:
            return pool.submit(_json_file, client, repo_id, revision, commit, name, siblings[name], url(name))

        wanted = [name for name in JSON_FILES if name in siblings]
        futures = {fetch(name): name for name in wanted if not (name == INDEX_FILE and prefetch is not None)}
        reader = HeaderReader(client, None, _arrivals(on_header, ahead, siblings))
        reads: dict[Future, str] = {}
        try:
            if prefetch is not None and INDEX_FILE in siblings and early_reads_enabled():
                # While the index is on its way, read the headers of the files it almost surely names
                # (sources/header_reads.py); it then decides which of them count.
                guessed = {s: siblings[s].size for s in shard_set(siblings)}
                reads = reader.start(pool, typical_size(list(guessed), guessed), url, guessed, speculative=True)
            early = len(reads)  # requested before the index was in
            prefetched, summary, json_view, cached = _index_and_json(prefetch, info.sha, siblings, client, repo_id,
                                                                     fetch, futures, json_files)
            phases["json_s"] = time.perf_counter() - started - phases["info_s"]
            shards = _shard_plan(repo_id, summary, siblings)
            sizes = {shard: siblings[shard].size for shard in shards}
            if summary is not None:
                reader.use_index(summary)
            asked = set(reads.values())
            later = [s for s in shards if s not in asked]
            reads.update(reader.start(pool, later, url, sizes))
            header_bytes = reader.collect(reads, shards, progress=progress)
        except BaseException:
            cancel(reads)
            raise
        finally:
            pool.shutdown(wait=True)  # the threads first: then no connection is in use
    phases["headers_s"] = time.perf_counter() - started - phases["info_s"] - phases["json_s"]
    plan, ahead_stats = None, {}
    if ahead is not None:  # else the report's scan stage scans them (in worker processes when that pays)
        fetched = time.perf_counter()
        scans = ahead.finish(header_bytes, sizes, wait_s=min(SCAN_WAIT_S, max(0.0, budget.left_s())))
        plan = ScanPlan(early={}, header_bytes=sum(len(h) for h in header_bytes.values()), scanned=scans)
        ahead_stats = {"scanned_ahead": ahead.fed, "scan_rest_s": time.perf_counter() - fetched}
    wall = time.perf_counter() - started
    return RawCheckpoint(
        ref=repo_id if revision is None else f"{repo_id}@{revision}",
        kind="hub",
        location=f"{endpoint}/{repo_id}@{commit}",
        files=tuple(sorted(siblings)),
        json_files=json_view,
        headers=header_bytes,
        file_sizes=sizes,
        revision=commit,
        stats={**stats.as_dict(), "wall_s": round(wall, 3), "shards": len(shards), "json_from_cache": cached,
               "header_bytes": sum(len(h) for h in header_bytes.values()), "endpoint": endpoint,
               "index_prefetched": prefetched is not None, "headers_before_index": early,
               **{k: round(v, 3) for k, v in {**phases, **ahead_stats}.items()}},
        index_summary=summary,
        scan_plan=plan,
    )


def _index_and_json(prefetch: IndexPrefetch | None, commit: str | None, siblings: Mapping[str, Any],
                    client: RangeClient, repo_id: str, fetch: Callable[[str], Future], futures: dict[Future, str],
                    json_files: dict[str, Any]) -> tuple[Any, IndexSummary | None, Mapping[str, Any], int]:
    """The index child's answer (or the index read here when it is not usable) and the small JSON files:
    (prefetched index or None, index summary or None, the JSON files view, how many came from the cache)."""
    stats, budget = client.stats, client.budget
    prefetched = None
    if prefetch is not None and INDEX_FILE in siblings:
        # The child's index counts only if it is this commit's (the small files download meanwhile).
        prefetched = prefetch.result(commit, wait_s=max(0.0, min(PREFETCH_WAIT_S, budget.left_s())))
        # The child's requests count whether or not its answer is used (--verbose, byte budget).
        child = prefetch.stats
        stats.add(requests=child.get("requests", 0), nbytes=child.get("bytes_fetched", 0),
                  retries=child.get("retries", 0))
        budget.take(child.get("bytes_fetched", 0), f"{repo_id}/{INDEX_FILE}")
        declared = siblings[INDEX_FILE].size
        if prefetched is not None and declared is not None and prefetched.size != declared:
            prefetched = None  # not the file the repo info describes
        if prefetched is None:
            budget.check_time(f"{repo_id}/{INDEX_FILE}")
            futures[fetch(INDEX_FILE)] = INDEX_FILE
    cached = 0
    for fut in as_completed(futures):
        value, from_cache = fut.result()
        json_files[futures[fut]] = value
        cached += from_cache
    if prefetched is not None:
        summary: IndexSummary | None = prefetched.summary
        view: Mapping[str, Any] = LazyJson(json_files, {INDEX_FILE: prefetched.load}, prefix=repo_id)
    else:
        summary = (summarize_index(json_files[INDEX_FILE], source=f"{repo_id}/{INDEX_FILE}")
                   if INDEX_FILE in json_files else None)
        view = json_files
    return prefetched, summary, view, cached


def _arrivals(on_header: Callable[[str, bytes], None] | None, ahead: ScanAhead | None,
              siblings: Mapping[str, Any]) -> Callable[[str, bytes], None] | None:
    """What a fetch thread calls with each header as it arrives: the caller's hook, the scan helper."""
    if ahead is None:
        return on_header

    def arrived(shard: str, header: bytes) -> None:
        if on_header is not None:
            on_header(shard, header)
        ahead.feed(shard, header, siblings[shard].size)
    return arrived


# -- small JSON files through the HF cache ----------------------------------------------------------
def _json_file(client: RangeClient, repo_id: str, revision: str | None, commit: str, name: str,
               sibling: Any, url: str) -> tuple[Any, int]:

    local = cached_file(repo_id, commit, name)
    cap = json_file_cap(name)  # the local files' caps (16 MiB, 512 MiB for the index): sources/interface.py
    if local is not None:
        data, from_cache = read_file_bytes(local), 1
    else:
        size = sibling.size
        if size is not None and size > cap:
            raise ConfigError(f"is {size:,} bytes, over the {cap:,}-byte cap for this file", path=f"{repo_id}/{name}")
        end = (size if size else cap) - 1
        data = client.get(url, name, 0, end) if end >= 0 else b""
        if size is not None and len(data) < size:
            data += client.rest(url, name, len(data), size)
        etag = sibling.lfs.sha256 if sibling.lfs is not None else sibling.blob_id
        # Written while this thread parses: the write releases the GIL, and a 41 MB index takes ~0.1 s
        # to write and ~0.3 s to parse here.
        writer = threading.Thread(target=cache_store, args=(repo_id, commit, revision or "main", name, data, etag))
        writer.start()
        try:
            return parse_json_bytes(data, source=f"{repo_id}/{name}"), 0
        finally:
            writer.join()
    return parse_json_bytes(data, source=f"{repo_id}/{name}"), from_cache


# -- shards ------------------------------------------------------------------------------------------
def _shard_plan(repo_id: str, summary: IndexSummary | None, siblings: Mapping[str, Any]) -> list[str]:
    """Shard names from the index's weight_map values (never from a name regex), else top-level files."""
    if summary is None:
        shards = sorted(n for n in siblings if n.endswith(".safetensors") and "/" not in n)
        if not shards:
            raise NotFoundError("no model.safetensors.index.json and no top-level .safetensors file", path=repo_id)
        return shards
    if not summary.shards:
        raise ConfigError("index has an empty weight_map", path=f"{repo_id}/{INDEX_FILE}")
    missing = sorted(s for s in summary.shards if s not in siblings)
    if missing:
        raise NotFoundError(f"the index names {len(missing)} shard(s) the repo does not have, e.g. {missing[0]}",
                            path=f"{repo_id}/{INDEX_FILE}")
    return list(summary.shards)  # first-seen order, like the local source


__all__ = ["open_hub", "hub_endpoint"]
