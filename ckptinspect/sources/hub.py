"""Read a checkpoint's metadata from the Hugging Face Hub (or any Hub-compatible endpoint) without
downloading weights: the file list, the small JSON files, and every shard's safetensors header.

Round trips, for a repo of S shards: 1 (model info with blob metadata: file list, sizes, commit) + one GET
per small JSON file not yet in the HF cache + S header GETs (first ranges sized from the index:
sources/header_ranges.py), over one ``httpx`` client (sources/hub_client.py) with bounded concurrency.
The read is one coroutine, ``read_hub``; ``open_hub`` is its synchronous edge (sources/net_edge.py).
The headers are kept as they arrive; the report scans them after the read, in index order
(inventory/scan.py). No process is started; the only threads are ``asyncio.to_thread``'s, for the
HF-cache and header-cache file I/O.

Small JSON files go through the HF cache layout (``models--org--name/blobs`` + ``snapshots/<commit>``,
sources/hf_cache.py), so a second run reads them from disk and ``hf_hub_download`` finds them too.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Mapping
from urllib.parse import quote

from ckptinspect.errors import CkptInspectError, ConfigError, HeaderError, NotFoundError
from ckptinspect.header.index import index_name, is_mistral_format, is_mistral_shard, summarize_index
from ckptinspect.header.parser import read_length_prefix
from ckptinspect.progress import Progress, as_progress
from ckptinspect.records import IndexSummary, RawCheckpoint
from ckptinspect.sources.header_cache import HeaderCache, entry_key
from ckptinspect.sources.header_ranges import MAX_HEADER_LENGTH, RangeSizer
from ckptinspect.sources.hf_cache import cache_store, cached_file, describe_cache_gap
from ckptinspect.sources.hub_client import HubClient
from ckptinspect.sources.hub_session import HubSession, hub_endpoint, hub_session
from ckptinspect.sources.interface import (
    CONFIG, JSON_FILES, is_index_file, json_file_cap, parse_json_bytes, read_file_bytes,
)
from ckptinspect.sources.net_edge import run_sync
from ckptinspect.sources.offline import hub_offline
from ckptinspect.sources.redact import redact_url
from ckptinspect.sources.repo_info import RepoFile, model_info
from ckptinspect.sources.subfolders import SubfolderChooser, chosen
from ckptinspect.settings import DEFAULTS, Settings

INDEX_FILE = "model.safetensors.index.json"
# Header requests in flight at once: httpx's default keep-alive pool holds 20 connections, so every
# request reuses one (more would open and close a connection per request).
DEFAULT_MAX_WORKERS = DEFAULTS.max_workers
WORKERS_ENV = "CKPTINSPECT_MAX_WORKERS"  # sets Settings.max_workers (ckptinspect/settings.py)


def open_hub(repo_id: str, **options: Any) -> RawCheckpoint:
    """``read_hub`` run to its end from synchronous code (sources/net_edge.py): the same arguments."""
    return run_sync(lambda: read_hub(repo_id, **options))


async def read_hub(repo_id: str, *, revision: str | None = None, token: str | None = None,
                   endpoint: str | None = None, progress: Progress | bool = True, max_workers: int | None = None,
                   timeout: float | None = None, on_header: Callable[[str, bytes], None] | None = None,
                   header_cache: bool | None = None, settings: Settings | None = None,
                   limiter: asyncio.Semaphore | None = None, ends_at: float | None = None,
                   subfolders: SubfolderChooser | None = None) -> RawCheckpoint:
    """Read ``repo_id`` at ``revision`` from the Hub: file list, small JSON files, every shard header.

    Args:
        repo_id: ``org/name``.
        revision: branch, tag or commit; default ``main``.
        token: access token; default HF_TOKEN / the saved login (huggingface_hub's rules).
        endpoint: Hub URL; default ``settings.endpoint``, else huggingface_hub's (HF_ENDPOINT or
            https://huggingface.co).
        progress: where the phases of the read go (repo info, index, headers n/N; ckptinspect/progress.py):
            a Progress, or True for one line on stderr when it is a terminal, False for none.
        max_workers: header requests in flight at once (default ``settings.max_workers``, 20).
        timeout: seconds per socket read (default ``settings.read_timeout_s``, 10); the connect timeout,
            the per-request and whole-read deadlines, the byte budget and the attempts per request come
            from ``settings`` (sources/net_limits.py, docs/security.md).
        on_header: called with (shard, header bytes) as each header arrives.
        header_cache: reuse headers stored by an earlier read of the same commit and file etag
            (sources/header_cache.py); default ``settings.header_cache`` (used only when
            ``settings.cache_dir`` names a directory).
        settings: the command's settings (ckptinspect/settings.py); None: every default, and no header cache.
        limiter: the bound on requests in flight this read shares with other reads on the same event
            loop (the audit's), or None.
        ends_at: a ``time.monotonic()`` value the read may not pass (the audit's deadline), or None.
        subfolders: which draft subfolders to read too, from the parsed config.json (sources/subfolders.py):
            each one's JSON files and shard headers, named in this read's file listing, over the same client
            (its byte budget, deadline and limiter), into ``RawCheckpoint.subfolders``.

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
    settings = settings or DEFAULTS
    session = hub_session(endpoint, token, timeout=timeout, ends_at=ends_at, settings=settings)
    workers = max(1, max_workers or settings.max_workers)
    reader = _HubRead(repo_id, revision, session, workers, HeaderCache.default(header_cache, settings))
    progress = as_progress(progress, label=repo_id)
    try:
        async with session.open(repo_id, limiter) as hub:
            return await reader.read(hub, progress=progress, on_header=on_header, started=started,
                                     subfolders=subfolders)
    except CkptInspectError as exc:
        raise session.scrubbed(exc) from None
    finally:
        progress.end()


@dataclass(frozen=True)
class _Tree:
    """What one read of the repo root or of one subfolder gathered (names relative to it)."""

    files: tuple[str, ...]
    json_files: dict[str, Any]
    shards: tuple[str, ...]
    sizes: dict[str, int | None]
    headers: dict[str, bytes]
    summary: IndexSummary | None
    json_from_cache: int


class _HubRead:
    """One Hub read of one repo."""

    def __init__(self, repo_id: str, revision: str | None, session: HubSession, workers: int,
                 cache: HeaderCache) -> None:
        self.repo_id, self.revision, self.session, self.workers = repo_id, revision, session, workers
        self.endpoint = session.endpoint
        self.phases: dict[str, float] = {}
        self.cache = cache
        self.from_cache = 0

    async def read(self, hub: HubClient, *, progress: Progress, on_header: Callable[[str, bytes], None] | None,
                   started: float, subfolders: SubfolderChooser | None = None) -> RawCheckpoint:
        t0 = time.perf_counter()
        progress.phase("repo info")
        info = await model_info(hub, self.endpoint, self.repo_id, self.revision)
        self.phases["info_s"] = time.perf_counter() - t0
        commit = info.sha or self.revision or "main"
        siblings = {s.rfilename: s for s in (info.siblings or [])}
        tree = await self._tree(hub, info, commit, siblings, "", progress=progress, on_header=on_header, t0=t0)
        # draft subfolders the family declares (sources/subfolders.py): the same client, so the same byte
        # budget, deadline and limiter; their files from this one listing, their headers as the shards'
        subs: dict[str, RawCheckpoint] = {}
        # the chooser matches the config against the rules (file reads): off the event loop
        names = (await asyncio.to_thread(chosen, subfolders, tree.json_files.get(CONFIG), siblings)
                 if subfolders is not None else [])
        for name in names:
            inner = {f[len(name) + 1:]: s for f, s in siblings.items() if f.startswith(name + "/")}
            sub = await self._tree(hub, info, commit, inner, name + "/", progress=progress, on_header=on_header,
                                   t0=None)
            subs[name] = self._record(sub, commit, {"shards": len(sub.shards)}, name + "/")
        wall = time.perf_counter() - started
        shown = redact_url(self.endpoint)
        stats = {**hub.stats.as_dict(), "wall_s": round(wall, 3), "shards": len(tree.shards),
                 "json_from_cache": tree.json_from_cache, "headers_from_cache": self.from_cache,
                 "header_bytes": sum(len(h) for h in tree.headers.values()),
                 "endpoint": shown, **{k: round(v, 3) for k, v in self.phases.items()}}
        return replace(self._record(tree, commit, stats, ""), subfolders=subs)

    def _record(self, tree: "_Tree", commit: str, stats: dict[str, Any], prefix: str) -> RawCheckpoint:
        shown = redact_url(self.endpoint)
        ref = self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"
        return RawCheckpoint(
            ref=ref + (f"/{prefix.rstrip('/')}" if prefix else ""),
            kind="hub",
            location=f"{shown}/{self.repo_id}@{commit}" + (f"/{prefix.rstrip('/')}" if prefix else ""),
            files=tuple(sorted(tree.files)),
            json_files=tree.json_files,
            headers={s: tree.headers[s] for s in tree.shards},
            file_sizes=tree.sizes,
            revision=commit,
            stats=stats,
            index_summary=tree.summary,
        )

    async def _tree(self, hub: HubClient, info: Any, commit: str, siblings: Mapping[str, RepoFile], prefix: str,
                    *, progress: Progress, on_header: Callable[[str, bytes], None] | None,
                    t0: float | None) -> "_Tree":
        """The JSON files and shard headers of the repo root (``prefix`` "") or of one subfolder (``prefix``
        "name/": ``siblings`` relative to it); ``t0``: time the phases (the root's read only)."""
        where = self.repo_id + (f"/{prefix.rstrip('/')}" if prefix else "")

        def url(filename: str) -> str:  # huggingface_hub's HUGGINGFACE_CO_URL_TEMPLATE, pinned to the commit
            return f"{self.endpoint}/{self.repo_id}/resolve/{quote(commit, safe='')}/{quote(prefix + filename)}"

        wanted = [name for name in JSON_FILES if name in siblings]
        index = index_name(siblings)  # Mistral's consolidated index in its format (header/index.py)
        progress.phase("index" if index in wanted else "config")
        answers = await asyncio.gather(*(self._json_file(hub, commit, prefix + name, siblings[name], url(name),
                                                         tuple(siblings) if is_index_file(name) else None)
                                         for name in wanted))
        json_files = {name: value for name, (value, _) in zip(wanted, answers)}
        if t0 is not None:
            self.phases["json_s"] = time.perf_counter() - t0 - self.phases["info_s"]
        summary = (summarize_index(json_files[index], source=f"{where}/{index}") if index in json_files else None)
        shards = _shard_plan(where, summary, siblings)
        sizes = {shard: siblings[shard].size for shard in shards}
        header_bytes: dict[str, bytes] = {}

        def arrived(shard: str, header: bytes) -> None:
            header_bytes[shard] = header
            if on_header is not None:
                on_header(prefix + shard, header)
            progress.phase("headers", len(header_bytes), len(shards))

        progress.phase("headers", 0, len(shards))
        # Headers pinned by the commit and the file's etag come from the header cache, the rest from the Hub.
        keys = {s: entry_key(self.endpoint, self.repo_id, info.sha or "", prefix + s, siblings[s].etag, sizes[s])
                for s in shards}
        cached = await asyncio.to_thread(lambda: {s: self.cache.get(keys[s]) for s in shards})
        for shard in shards:
            if cached[shard] is not None:
                self.from_cache += 1
                arrived(shard, cached[shard])
        missing = [s for s in shards if cached[s] is None]
        # Each header is stored as it arrives, in a worker thread (hashing and writing release the GIL), so
        # the stores overlap the requests still in flight instead of following the last one; one store at a
        # time (each waits for the one before): a wave of answers arriving together would otherwise wake a
        # worker each, contending with the event loop for the GIL (~0.2 CPU-s more per report at 100 ms
        # per request, BENCHMARKS.md).
        storing: asyncio.Future | None = None
        async for shard, header in read_headers(hub, missing, sizes, url, summary, self.workers):
            arrived(shard, header)
            if keys[shard] is not None and self.cache.root is not None:
                storing = asyncio.ensure_future(self._store_after(storing, keys[shard], header))
        if storing is not None:
            await storing
            if self.cache.stored:  # then keep the directory under its cap
                await asyncio.to_thread(self.cache.evict)
        if t0 is not None:
            self.phases["headers_s"] = time.perf_counter() - t0 - self.phases["info_s"] - self.phases["json_s"]
        return _Tree(files=tuple(siblings), json_files=json_files, shards=tuple(shards), sizes=sizes,
                     headers=header_bytes, summary=summary, json_from_cache=sum(c for _, c in answers))

    async def _store_after(self, previous: "asyncio.Future | None", key: bytes, header: bytes) -> None:
        """Store ``header`` in the header cache once the store before it is done (its error, if any, first)."""
        if previous is not None:
            await previous
        await asyncio.to_thread(self.cache.put, key, header)

    async def _json_file(self, hub: HubClient, commit: str, name: str, sibling: RepoFile, url: str,
                         files: tuple[str, ...] | None) -> tuple[Any, int]:
        """(parsed, 1 when it came from the HF cache); ``files``: the listing an index is decoded against."""
        local = cached_file(self.repo_id, commit, name)
        cap = json_file_cap(name.rsplit("/", 1)[-1])  # the local files' caps (16 MiB, 256 MiB for the index): sources/interface.py
        where = f"{self.repo_id}/{name}"
        if local is not None:
            data = read_file_bytes(local)
            return parse_json_bytes(data, source=where, files=files), 1
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
            asyncio.to_thread(parse_json_bytes, data, source=where, files=files))
        return parsed, 0


async def read_headers(hub: HubClient, shards: list[str], sizes: Mapping[str, int | None],
                       url: Callable[[str], str], summary: IndexSummary | None,
                       workers: int) -> AsyncIterator[tuple[str, bytes]]:
    """``(shard, header bytes)`` for every shard, in arrival order, with at most ``workers`` requests in
    flight: the first ones sized by the first guess, each later one by the headers already in (RangeSizer).
    Fails fast: the first error cancels the requests still running."""
    sizer = RangeSizer(summary)
    rest = list(shards)
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
    """Shard names from the index's weight_map values (never from a name regex), else top-level files: in
    Mistral's format the consolidated*.safetensors ones only (the files vLLM loads, header/index.py)."""
    index = index_name(siblings)
    if summary is None:
        mistral = is_mistral_format(siblings)
        shards = sorted(n for n in siblings if n.endswith(".safetensors") and "/" not in n
                        and (not mistral or is_mistral_shard(n)))
        if not shards:
            raise NotFoundError("no model.safetensors.index.json and no top-level .safetensors file", path=repo_id)
        return shards
    if not summary.shards:
        raise ConfigError("index has an empty weight_map", path=f"{repo_id}/{index}")
    missing = sorted(s for s in summary.shards if s not in siblings)
    if missing:
        raise NotFoundError(f"the index names {len(missing)} shard(s) the repo does not have, e.g. {missing[0]}",
                            path=f"{repo_id}/{index}")
    return list(summary.shards)  # first-seen order, like the local source


__all__ = ["open_hub", "read_hub", "hub_endpoint", "read_headers"]
