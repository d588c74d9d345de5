"""GGUF headers from a Hub repo over HTTP range requests, through the one bounded client
(sources/hub_client.py: the command's deadline and byte budget, Retry-After, body caps, redaction).

One repo-info call (sources/repo_info.py: file names, sizes, the commit) picks the model set and its MTP
companions; each file's header is then read with ``Range`` requests, the files at once under the same
bound on requests in flight as safetensors headers. The first range is 16 KiB; the header parser
(header/gguf.py) says how much more it needs, sized from what it already knows (the remaining items of
an array times their mean size so far), so a 12 MB tokenizer costs a few requests and the bytes received
stay within a few percent of the header. The parser is synchronous and the requests are not, so a parse
that runs past the bytes held stops (``_NeedBytes``), the bytes it asked for are fetched, and the parse
starts again over the longer window: a few parses of the header, never a thread. A server that ignores
``Range`` is refused: tensor data is never downloaded.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from ckptinspect.errors import CkptInspectError, NetworkError
from ckptinspect.header.gguf import ByteWindow, GgufHeader, parse_gguf
from ckptinspect.sources.gguf_files import RawGguf, check_split, companions_for, select_set
from ckptinspect.sources.hub_client import HubClient
from ckptinspect.sources.hub_session import hub_session
from ckptinspect.sources.net_edge import run_sync
from ckptinspect.settings import DEFAULTS, Settings
from ckptinspect.sources.redact import redact_url
from ckptinspect.sources.repo_info import model_info

FIRST_RANGE = 16 << 10
FILES_IN_FLIGHT = 20  # as the safetensors headers (sources/hub.py DEFAULT_MAX_WORKERS)


class _NeedBytes(Exception):
    """The parse needs bytes ``[start, stop)`` that the window does not hold yet."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__(start, stop)
        self.start, self.stop = start, stop


def open_gguf_hub(repo_id: str, **options: Any) -> RawGguf:
    """``read_gguf_hub`` run to its end from synchronous code (sources/net_edge.py)."""
    return run_sync(lambda: read_gguf_hub(repo_id, **options))


async def read_gguf_hub(repo_id: str, *, ref: str, tag: str | None, revision: str | None, token: str | None,
                        limiter: asyncio.Semaphore | None = None, ends_at: float | None = None,
                        settings: Settings = DEFAULTS) -> RawGguf:
    session = hub_session(None, token, ends_at=ends_at, settings=settings)
    shown = redact_url(session.endpoint)
    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        async with session.open(repo_id, limiter) as hub:
            info = await model_info(hub, session.endpoint, repo_id, revision,
                                    missing="repo not found (or private: pass a token)")
            info_bytes = hub.stats.bytes_fetched
            sizes = {s.rfilename: s.size for s in info.siblings}
            names = sorted(sizes)
            chosen, files, sets = select_set(names, tag, where=where)
            commit = info.sha or revision or "main"

            def url(name: str) -> str:  # huggingface_hub's HUGGINGFACE_CO_URL_TEMPLATE, pinned to the commit
                return f"{session.endpoint}/{repo_id}/resolve/{quote(commit, safe='')}/{quote(name)}"

            gate = asyncio.Semaphore(FILES_IN_FLIGHT)

            async def one(name: str) -> tuple[str, GgufHeader]:
                async with gate:
                    return name, await _header(hub, url(name), name, sizes.get(name), f"{where}/{name}")

            parts = await _all(one, files)
            check_split(parts, where=f"{where}/{chosen}")
            heads = await _all(one, companions_for(names, chosen))
    except CkptInspectError as exc:
        raise session.scrubbed(exc) from None
    stats = {"requests": hub.stats.requests, "bytes_received": hub.stats.bytes_fetched - info_bytes,
             "header_bytes": sum(h.header_bytes for _, h in parts + heads), "files_read": len(parts) + len(heads)}
    return RawGguf(ref=ref, kind="hub", location=f"{shown}/{repo_id}", files=tuple(names), model=chosen,
                   parts=tuple(parts), companions=tuple(heads), model_sets=sets, revision=info.sha or revision,
                   stats=stats)


async def _all(one: Any, names: list[str]) -> list[tuple[str, GgufHeader]]:
    """``one(name)`` for every name at once, in ``names``' order; the first error cancels the rest."""
    tasks = [asyncio.ensure_future(one(name)) for name in names]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _header(hub: HubClient, url: str, name: str, size: int | None, source: str) -> GgufHeader:
    first = FIRST_RANGE if size is None else min(FIRST_RANGE, size)
    data = await hub.get_range(url, name, 0, first - 1, ranges_required=True) if first > 0 else b""

    def extend(start: int, stop: int) -> bytes:
        raise _NeedBytes(start, stop)

    while True:
        try:
            return parse_gguf(ByteWindow(data, source=source, file_size=size, extend=extend))
        except _NeedBytes as need:
            more = await hub.get_range(url, name, need.start, need.stop - 1, ranges_required=True)
            if not more:
                raise NetworkError(f"the server sent no bytes for bytes={need.start}-{need.stop - 1}",
                                   path=source) from None
            data += more
