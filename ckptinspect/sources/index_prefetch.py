"""Fetch and summarize a Hub repo's safetensors index in a child process, while the parent starts up.

Every header read is sized from the index (hub.py), so on a cold cache the index sits on the critical
path: a 41 MB index takes ~0.3 s to parse and ~0.1 s to summarize. Meanwhile the parent spends ~0.3 s
importing huggingface_hub and asking for the repo info. A child forked before those imports (cheap:
the heap is small and no thread exists yet) reads the index by revision, parses it and sends back only
its IndexSummary, so both run at once. The child never imports huggingface_hub; its request is an
optimization the parent checks, not trusted: the parent uses it only when the commit the Hub answered
with (X-Repo-Commit) is the commit of its own repo-info call, and otherwise (a moved branch, a gated repo
the child had no token for, no index at all, any error) reads the index itself as before.

The child also stores the index in the HF cache (as huggingface_hub would: the blob named by its etag)
and leaves its bytes in a shared memory file, from which the parent parses the full index only if
something asks for it (a snapshot, or a mismatch between headers and index to explain).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import weakref
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from ckptinspect.errors import SourceError
from ckptinspect.records import IndexSummary
from ckptinspect.sources.http_fields import content_range_total
from ckptinspect.sources.http_ranges import FetchStats, RangeClient
from ckptinspect.sources.interface import INDEX as INDEX_FILE, MAX_INDEX_FILE_BYTES, open_spool
from ckptinspect.sources.net_limits import Budget, NetLimits

MAX_INDEX_BYTES = MAX_INDEX_FILE_BYTES  # the local index's cap too
# The child asks for this much first (the largest index seen, a 163-shard FP8 MoE one, is ~45 MB): a
# server that ignores Range and streams a larger body costs at most this much, counted, before the
# child gives up and the parent reads the index with the size the repo info declares.
FIRST_RANGE_BYTES = 64 * 1024 * 1024
_FAILED = "failed"
_DISABLE_HINT = "CKPTINSPECT_INDEX_PREFETCH=0"


@dataclass(frozen=True)
class PrefetchedIndex:
    summary: IndexSummary
    size: int
    load: Callable[[], bytes]  # the index bytes, read back from the shared file on demand
    stats: dict[str, int]  # the child's requests and bytes, for --verbose


class IndexPrefetch:
    """The child process and the pipe its answer comes through. Always ``close()`` it."""

    def __init__(self, process: Any, receive: Any, spool: int) -> None:
        self._process = process
        self._receive = receive
        self._spool: int | None = spool
        self._answer: Any = None

    @property
    def stats(self) -> dict[str, int]:
        """The child's requests and body bytes (also when its answer is not used); empty before ``result``."""
        return dict(self._answer[-1]) if self._answer is not None and isinstance(self._answer[-1], dict) else {}

    @classmethod
    def start(cls, endpoint: str, repo_id: str, revision: str | None, token: str | None,
              timeout: float, *, budget: Budget | None = None) -> "IndexPrefetch | None":
        """Fork the child, or None where that is not safe or possible (then the parent reads serially).

        The child runs under ``budget``'s deadline and what is left of its byte budget.
        """
        budget = budget if budget is not None else Budget(NetLimits.from_env(read_s=timeout))
        limits = (budget.limits, budget.ends_at, max(0, budget.max_bytes - budget.received))
        if os.name != "posix" or threading.active_count() > 1:
            return None
        url = f"{endpoint}/{repo_id}/resolve/{quote(revision or 'main', safe='')}/{INDEX_FILE}"
        headers = {"user-agent": "ckptinspect"}
        bearer = _token(token)
        if bearer:
            headers["authorization"] = f"Bearer {bearer}"
        try:
            ctx = get_context("fork")
            spool = open_spool("index")
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_child, args=(send, spool, url, headers, timeout, repo_id, revision, limits),
                                  daemon=True)
            process.start()
        except (OSError, ValueError):
            return None
        send.close()
        return cls(process, receive, spool)

    def result(self, commit: str | None, wait_s: float) -> PrefetchedIndex | None:
        """The child's summary if it read ``commit``'s index; None means: read it yourself."""
        if self._answer is None:
            try:
                self._answer = self._receive.recv() if self._receive.poll(wait_s) else (_FAILED, "no answer", {})
            except (EOFError, OSError):
                self._answer = (_FAILED, "child exited", {})
        answer = self._answer
        if answer[0] == _FAILED or commit is None or answer[1] != commit:
            return None
        _, _, summary, size, stats = answer
        spool, self._spool = [self._spool], None  # the loader owns the file now

        def load() -> bytes:
            self._process.join()  # the child writes the file after answering
            data = os.pread(spool[0], size, 0)
            _close_spool(spool)
            if len(data) != size:  # the child was stopped before it wrote everything
                raise SourceError(f"the index read during start-up is incomplete ({len(data):,} of {size:,} "
                                  f"bytes); run again with {_DISABLE_HINT}", path=INDEX_FILE)
            return data

        weakref.finalize(load, _close_spool, spool)  # never asked for: closed with the checkpoint
        return PrefetchedIndex(summary=summary, size=size, load=load, stats=stats)

    def close(self, *, kill: bool = False) -> None:
        """Wait for the child (it finishes its cache write), or stop it; the shared file lives on for ``load``.
        A child whose answer was never asked for is stopped: its work is not wanted."""
        if not kill and self._answer is not None:
            self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._receive.close()
        if self._spool is not None:  # the answer was not used
            os.close(self._spool)
            self._spool = None


def _child(send: Any, spool: int, url: str, headers: dict[str, str], timeout: float, repo_id: str,
           revision: str | None, limits: tuple[NetLimits, float, int]) -> None:
    from ckptinspect.sources.hf_cache import cache_store
    from ckptinspect.sources.index_summary import summarize_index_bytes

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then kills us
    gc.disable()
    stats = FetchStats()
    try:
        net_limits, ends_at, max_bytes = limits
        budget = Budget(net_limits, ends_at=ends_at, max_bytes=max_bytes)
        # One attempt: on any failure the parent reads the index with its own retries, so a flaky
        # server costs one request more, not a second round of backoff.
        client = RangeClient(repo_id, headers, timeout=timeout, stats=stats, attempts=1, budget=budget)
        meta: dict[str, str] = {}
        try:
            data = client.get(url, INDEX_FILE, 0, FIRST_RANGE_BYTES - 1, meta=meta)
            total = content_range_total(meta.get("content-range"))
            if total is None and len(data) >= FIRST_RANGE_BYTES:  # a 200 (Range ignored) that goes on
                raise SourceError(f"a whole-file answer over {FIRST_RANGE_BYTES:,} bytes", path=INDEX_FILE)
            if total is not None and len(data) < min(total, MAX_INDEX_BYTES):
                data += client.rest(url, INDEX_FILE, len(data), min(total, MAX_INDEX_BYTES))
        finally:
            client.close()
        summary = summarize_index_bytes(data, source=f"{repo_id}/{INDEX_FILE}")
        commit = meta.get("x-repo-commit")
        send.send(("ok", commit, summary, len(data), stats.as_dict()))
    except Exception as exc:  # noqa: BLE001 - any failure: the parent reads the index itself
        send.send((_FAILED, f"{type(exc).__name__}: {exc}", stats.as_dict()))
        return
    finally:
        send.close()
    os.pwrite(spool, data, 0)
    etag = (meta.get("x-linked-etag") or meta.get("etag") or "").removeprefix("W/").strip('"') or None
    if commit:
        cache_store(repo_id, commit, revision or "main", INDEX_FILE, data, etag, source_fd=spool)


def _close_spool(holder: list[int | None]) -> None:
    if holder[0] is not None:
        os.close(holder[0])
        holder[0] = None


def _token(explicit: str | None) -> str | None:
    """The token huggingface_hub would send, found without importing it (it costs ~0.2 s to import):
    --token, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then the token file. Guessing wrong costs only the
    prefetch (a 401 makes the parent read the index itself, with huggingface_hub's own token)."""
    if explicit:
        return explicit
    if os.environ.get("HF_HUB_DISABLE_IMPLICIT_TOKEN", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
        return None
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    path = os.environ.get("HF_TOKEN_PATH")
    if not path:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
        path = os.path.join(home, "token")
    from ckptinspect.errors import CkptInspectError
    from ckptinspect.guarded_file import read_text

    try:  # a token file is tiny: a FIFO or a device there must not hang or fill memory
        return read_text(Path(path).expanduser(), what="HF token file", cap=64 * 1024).strip() or None
    except CkptInspectError:
        return None
