"""Read a checkpoint's metadata from the Hugging Face Hub (or any Hub-compatible endpoint) without
downloading weights: the file list, the small JSON files, and every shard's safetensors header.

Round trips, for a repo of S shards: 1 (model info with blob metadata: file list, sizes, commit) + one GET
per small JSON file not yet in the HF cache + S header GETs (first ranges sized from the index:
sources/header_ranges.py), over one ``httpx`` client (sources/hub_client.py) with bounded concurrency.
The network side runs as an ``asyncio`` task in one helper thread (so the reader works the same inside a
program that has its own event loop); this thread consumes the headers as they arrive and hands each to
the caller's ``on_header`` at once. No process is started.

Small JSON files go through the HF cache layout (``models--org--name/blobs`` + ``snapshots/<commit>``,
sources/hf_cache.py), so a second run reads them from disk and ``hf_hub_download`` finds them too.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable, Mapping
from urllib.parse import quote

from ckptinspect.errors import CkptInspectError, ConfigError, HeaderError, NotFoundError
from ckptinspect.header.parser import read_length_prefix
from ckptinspect.progress import SILENT, Progress, as_progress
from ckptinspect.records import IndexSummary, RawCheckpoint
from ckptinspect.sources.header_cache import HeaderCache, entry_key
from ckptinspect.sources.header_ranges import MAX_HEADER_LENGTH, RangeSizer
from ckptinspect.sources.hf_cache import cache_store, cached_file, describe_cache_gap
from ckptinspect.sources.hub_client import FetchStats, HubClient, make_client
from ckptinspect.header.index import summarize_index
from ckptinspect.sources.interface import JSON_FILES, json_file_cap, parse_json_bytes, read_file_bytes
from ckptinspect.sources.net_limits import Budget, NetLimits
from ckptinspect.sources.offline import hub_offline
from ckptinspect.sources.redact import redact_url, scrub
from ckptinspect.sources.shared_limits import RequestLimiter, SharedLimits, current_shared_limits
from ckptinspect.sources.repo_info import RepoFile, model_info

INDEX_FILE = "model.safetensors.index.json"
# Header requests in flight at once: httpx's default keep-alive pool holds 20 connections, so every
# request reuses one (more would open and close a connection per request).
DEFAULT_MAX_WORKERS = 20
_STOP_GRACE_S = 5.0  # how long a stopped read may take to unwind before the caller goes on without it
WORKERS_ENV = "CKPTINSPECT_MAX_WORKERS"


def hub_endpoint(endpoint: str | None = None) -> str:
    """The Hub endpoint: argument, else HF_ENDPOINT read now (not at import), else huggingface.co."""
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def download_timeout() -> float:
    """Seconds per socket read: HF_HUB_DOWNLOAD_TIMEOUT, default 10 (huggingface_hub's own default)."""
    return NetLimits.from_env().read_s


def open_hub(repo_id: str, *, revision: str | None = None, token: str | None = None,
             endpoint: str | None = None, progress: Progress | bool = True, max_workers: int | None = None,
             timeout: float | None = None, on_header: Callable[[str, bytes], None] | None = None,
             header_cache: bool | None = None) -> RawCheckpoint:
    """Read ``repo_id`` at ``revision`` from the Hub: file list, small JSON files, every shard header.

    Args:
        repo_id: ``org/name``.
        revision: branch, tag or commit; default ``main``.
        token: access token; default HF_TOKEN / the saved login (huggingface_hub's rules).
        endpoint: Hub URL; default HF_ENDPOINT or https://huggingface.co.
        progress: where the phases of the read go (repo info, index, headers n/N; ckptinspect/progress.py):
            a Progress, or True for one line on stderr when it is a terminal, False for none.
        max_workers: header requests in flight at once (default 20, env CKPTINSPECT_MAX_WORKERS).
        timeout: seconds per socket read (default HF_HUB_DOWNLOAD_TIMEOUT, 10); the connect timeout,
            the per-request and whole-read deadlines and the byte budget come from the environment
            (sources/net_limits.py, docs/security.md).
        on_header: called in the calling thread with (shard, header bytes) as each header arrives.
        header_cache: reuse headers stored by an earlier read of the same commit and file etag
            (sources/header_cache.py); default on unless CKPTINSPECT_HEADER_CACHE=0.

    Raises:
        NotFoundError: repo, revision or file missing, or HF_HUB_OFFLINE=1 (names what the cache lacks).
        AccessError: gated / private repo without a token that grants access.
        NetworkError: timeouts, 5xx, resets, broken ranges after bounded retries; the deadline or
            the byte budget of the whole read; a proxy that cannot be reached (named).
        HeaderError: a header length prefix over 25,000,000 bytes or beyond the file size.
    """
    if hub_offline():
        raise NotFoundError(f"HF_HUB_OFFLINE=1 and the HF cache cannot answer: {describe_cache_gap(repo_id, revision)}",
                            path=repo_id, hint="run once online, or use a .json.gz snapshot")
    started = time.perf_counter()
    endpoint = hub_endpoint(endpoint)
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(token=token)
    secrets = tuple(filter(None, [token, headers.get("authorization", "").removeprefix("Bearer ")]))
    limits = NetLimits.from_env(read_s=timeout)
    shared = current_shared_limits() or SharedLimits()  # an audit's shared bound and deadline, if any
    budget = Budget(limits)
    if shared.ends_at is not None:
        budget.ends_at = min(budget.ends_at, shared.ends_at)
    reader = _HubRead(repo_id, revision, endpoint, headers, budget, secrets,
                      max(1, max_workers or int(os.environ.get(WORKERS_ENV) or DEFAULT_MAX_WORKERS)),
                      HeaderCache.default(header_cache))
    reader.limiter = shared.limiter
    return reader.run(progress=as_progress(progress, label=repo_id), on_header=on_header,
                      started=started)


class _HubRead:
    """One Hub read: the ``asyncio`` side in a helper thread, its results consumed by the caller's thread."""

    def __init__(self, repo_id: str, revision: str | None, endpoint: str, headers: Mapping[str, str],
                 budget: Budget, secrets: tuple[str, ...], workers: int, cache: HeaderCache) -> None:
        self.repo_id, self.revision, self.endpoint = repo_id, revision, endpoint
        self.headers, self.budget, self.secrets, self.workers = dict(headers), budget, secrets, workers
        self.stats = FetchStats()
        self.out: queue.Queue = queue.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None
        self.phases: dict[str, float] = {}
        self.stopping = threading.Event()  # set by the caller's thread: do not start (or go on)
        self.limiter: RequestLimiter | None = None  # shared with other reads (sources/shared_limits.py)
        self.cache = cache
        self.from_cache = 0
        self.progress: Progress = SILENT

    # -- the caller's thread -------------------------------------------------------------------------
    def run(self, *, progress: Progress, on_header: Callable[[str, bytes], None] | None,
            started: float) -> RawCheckpoint:
        self.progress = progress
        thread = threading.Thread(target=self._thread_main, name="ckptinspect-hub", daemon=True)
        thread.start()
        header_bytes: dict[str, bytes] = {}
        try:
            meta = self._next("meta")
            shards, sizes = meta["shards"], meta["sizes"]
            progress.phase("headers", 0, len(shards))
            for done, _ in enumerate(shards, 1):
                shard, header = self._next("header")
                header_bytes[shard] = header
                if on_header is not None:
                    on_header(shard, header)
                progress.phase("headers", done, len(shards))
            self._next("done")
        finally:
            progress.end()
            self._stop(thread)
        wall = time.perf_counter() - started
        commit = meta["commit"]
        shown = redact_url(self.endpoint)
        return RawCheckpoint(
            ref=self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}",
            kind="hub",
            location=f"{shown}/{self.repo_id}@{commit}",
            files=meta["files"],
            json_files=meta["json_files"],
            headers={s: header_bytes[s] for s in shards},
            file_sizes=sizes,
            revision=commit,
            stats={**self.stats.as_dict(), "wall_s": round(wall, 3), "shards": len(shards),
                   "json_from_cache": meta["cached"], "headers_from_cache": self.from_cache,
                   "header_bytes": sum(len(h) for h in header_bytes.values()),
                   "endpoint": shown, **{k: round(v, 3) for k, v in self.phases.items()}},
            index_summary=meta["summary"],
        )

    def _next(self, kind: str) -> Any:
        while True:
            try:
                got, value = self.out.get(timeout=0.5)  # a timeout keeps Ctrl-C responsive everywhere
            except queue.Empty:
                continue
            if got == "error":
                raise value
            if got == "phase":  # drawn in this thread, the one that owns the terminal line
                self.progress.phase(value)
                continue
            assert got == kind, (got, kind)
            return value

    def _stop(self, thread: threading.Thread) -> None:
        """Cancel what is still running (an error or Ctrl-C here) and wait for the thread to end."""
        self.stopping.set()
        # Cancel again until the thread ends: one cancel can be absorbed (racing a timeout that fires at
        # the same moment, or caught in a library's cleanup). The wait is bounded: a read that ignores
        # cancellation must not keep Ctrl-C from ending the command (the thread is a daemon and holds
        # nothing the caller reads after this).
        give_up = time.monotonic() + _STOP_GRACE_S
        while thread.is_alive() and time.monotonic() < give_up:
            loop, task = self.loop, self.task
            if loop is not None and task is not None and not task.done():
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop has just closed
                    pass
            thread.join(0.1)

    # -- the helper thread ---------------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            self.out.put(("error", exc))

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        if self.stopping.is_set():  # stopped before the loop was up: _stop found no task to cancel
            return
        client = make_client(self.budget)
        try:
            async with client:
                hub = HubClient(client, self.repo_id, self.headers, budget=self.budget, stats=self.stats,
                                secrets=self.secrets, limiter=self.limiter)
                await self._read(hub)
        except asyncio.CancelledError:
            return
        except CkptInspectError as exc:
            clean = scrub(str(exc), self.secrets)
            if clean != str(exc):
                raise type(exc)(clean) from None
            raise
        self.out.put(("done", None))

    async def _read(self, hub: HubClient) -> None:
        t0 = time.perf_counter()
        self.out.put(("phase", "repo info"))
        info = await model_info(hub, self.endpoint, self.repo_id, self.revision)
        self.phases["info_s"] = time.perf_counter() - t0
        commit = info.sha or self.revision or "main"
        siblings = {s.rfilename: s for s in (info.siblings or [])}

        def url(filename: str) -> str:  # huggingface_hub's HUGGINGFACE_CO_URL_TEMPLATE, pinned to the commit
            return f"{self.endpoint}/{self.repo_id}/resolve/{quote(commit, safe='')}/{quote(filename)}"

        wanted = [name for name in JSON_FILES if name in siblings]
        self.out.put(("phase", "index" if INDEX_FILE in wanted else "config"))
        answers = await asyncio.gather(*(self._json_file(hub, commit, name, siblings[name], url(name))
                                         for name in wanted))
        json_files = {name: value for name, (value, _) in zip(wanted, answers)}
        self.phases["json_s"] = time.perf_counter() - t0 - self.phases["info_s"]
        summary = (summarize_index(json_files[INDEX_FILE], source=f"{self.repo_id}/{INDEX_FILE}")
                   if INDEX_FILE in json_files else None)
        shards = _shard_plan(self.repo_id, summary, siblings)
        sizes = {shard: siblings[shard].size for shard in shards}
        self.out.put(("meta", {"commit": commit, "files": tuple(sorted(siblings)), "json_files": json_files,
                               "shards": shards, "sizes": sizes, "summary": summary,
                               "cached": sum(cached for _, cached in answers)}))
        # Headers pinned by the commit and the file's etag come from the header cache, the rest from the Hub.
        keys = {s: entry_key(self.endpoint, self.repo_id, info.sha or "", s, siblings[s].etag, sizes[s])
                for s in shards}
        cached = await asyncio.to_thread(lambda: {s: self.cache.get(keys[s]) for s in shards})
        for shard in shards:
            if cached[shard] is not None:
                self.from_cache += 1
                self.out.put(("header", (shard, cached[shard])))
        missing = [s for s in shards if cached[s] is None]
        # Each header is stored as it arrives, in a worker thread (hashing and writing release the GIL),
        # so the stores overlap the requests still in flight instead of following the last one.
        stores = []
        async for shard, header in read_headers(hub, missing, sizes, url, summary, self.workers):
            self.out.put(("header", (shard, header)))
            if keys[shard] is not None and self.cache.root is not None:
                stores.append(asyncio.ensure_future(asyncio.to_thread(self.cache.put, keys[shard], header)))
        if stores:
            await asyncio.gather(*stores)
            if self.cache.stored:  # then keep the directory under its cap
                await asyncio.to_thread(self.cache.evict)
        self.phases["headers_s"] = time.perf_counter() - t0 - self.phases["info_s"] - self.phases["json_s"]

    async def _json_file(self, hub: HubClient, commit: str, name: str, sibling: RepoFile, url: str) -> tuple[Any, int]:
        local = cached_file(self.repo_id, commit, name)
        cap = json_file_cap(name)  # the local files' caps (16 MiB, 256 MiB for the index): sources/interface.py
        where = f"{self.repo_id}/{name}"
        if local is not None:
            data = read_file_bytes(local)
            return parse_json_bytes(data, source=where), 1
        size = sibling.size
        if size is not None and size > cap:
            raise ConfigError(f"is {size:,} bytes, over the {cap:,}-byte cap for this file", path=where)
        end = (size if size else cap) - 1
        data = await hub.get_range(url, name, 0, end) if end >= 0 else b""
        if size is not None and len(data) < size:
            data += await hub.rest(url, name, len(data), size)
        etag = sibling.etag
        # Stored and parsed off the event loop, at once: the store's write (GIL released) overlaps the
        # parse, and the other files' requests go on meanwhile.
        _, parsed = await asyncio.gather(
            asyncio.to_thread(cache_store, self.repo_id, commit, self.revision or "main", name, data, etag),
            asyncio.to_thread(parse_json_bytes, data, source=where))
        return parsed, 0


async def read_headers(hub: HubClient, shards: list[str], sizes: Mapping[str, int | None],
                       url: Callable[[str], str], summary: IndexSummary | None,
                       workers: int) -> AsyncIterator[tuple[str, bytes]]:
    """``(shard, header bytes)`` for every shard, in arrival order: one calibration shard first (its header
    sizes the others' first ranges), then the rest with at most ``workers`` requests in flight.
    Fails fast: the first error cancels the requests still running."""
    sizer = RangeSizer(summary)
    rest = list(shards)
    if not sizer.calibrated and len(rest) > 1:
        first = sizer.calibration_shard(rest)
        rest.remove(first)
        yield first, await _read_header(hub, sizer, first, url(first), sizes.get(first))
    gate = asyncio.Semaphore(workers)

    async def one(shard: str) -> tuple[str, bytes]:
        async with gate:
            return shard, await _read_header(hub, sizer, shard, url(shard), sizes.get(shard))

    tasks = [asyncio.ensure_future(one(shard)) for shard in rest]
    try:
        for done in asyncio.as_completed(tasks):
            yield await done
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _read_header(hub: HubClient, sizer: RangeSizer, shard: str, url: str, size: int | None) -> bytes:
    where = f"{hub.repo_id}/{shard}"
    if size is not None and size < 8:
        raise HeaderError(f"file is {size} bytes, too small for a safetensors header", path=where)
    body = await hub.get_range(url, shard, 0, sizer.first_range(shard, size) - 1)
    if len(body) < 8:  # a short 206 that did not even cover the length prefix
        body += await hub.rest(url, shard, len(body), 8)
    n = read_length_prefix(body[:8], source=where, file_size=size, max_length=MAX_HEADER_LENGTH)
    if n > len(body) - 8:  # ranges are inclusive: the header is complete iff n <= len(body) - 8
        body += await hub.rest(url, shard, len(body), 8 + n)
    sizer.learn(shard, n)
    return body[8:8 + n]


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


__all__ = ["open_hub", "hub_endpoint", "read_headers"]
