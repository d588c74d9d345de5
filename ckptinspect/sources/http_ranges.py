"""Single-range HTTP GETs that never read past what was asked, with bounded retries.

Used by the Hub source to read safetensors headers. Rules behind the code:

- HTTP ranges are inclusive: ``bytes=a-b`` is ``b - a + 1`` bytes. Completeness is decided by the bytes
  actually received, never by the range asked for (the 100,000-byte off-by-one of
  huggingface/huggingface_hub#4602 came from mixing the two up).
- One range per request: the Hub answers multi-range requests with ``multipart/byteranges`` and no
  ``Content-Range`` (huggingface/huggingface_hub#2248).
- A server may ignore ``Range`` and answer ``200`` with the whole (multi-GB) file: the body is streamed
  and the connection dropped as soon as the asked bytes are in, so weights are never downloaded.
- Redirects (the Hub sends weights to its CDN) are followed, up to 5, each counted as a request.
- GET is idempotent, so timeouts, resets, truncated bodies, 429 / 5xx and inconsistent ``Content-Range``
  are retried with exponential backoff, a bounded number of times, then reported as one NetworkError
  line naming the repo and file.
"""

from __future__ import annotations

import http.client
import os
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field

from ckptinspect.errors import AccessError, NetworkError, NotFoundError
from ckptinspect.sources.http_conn import (MAX_REDIRECTS, REDIRECTS, ConnectionPool, Origin, redirect_target,
                                           request_target)

# Retried like huggingface_hub's http_backoff does (utils/_http.py _DEFAULT_RETRY_ON_STATUS_CODES).
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_ATTEMPTS = int(os.environ.get("CKPTINSPECT_HTTP_ATTEMPTS", "4"))
DEFAULT_BACKOFF_S = float(os.environ.get("CKPTINSPECT_HTTP_BACKOFF_S", "0.25"))
MAX_RETRY_AFTER_S = 30.0  # a 429 Retry-After longer than this is not worth waiting for in a CLI
META_HEADERS = ("x-repo-commit", "x-linked-etag", "etag", "content-range")
ERROR_BODY_LIMIT = 1 << 20  # error / redirect bodies read to keep the connection; larger ones close it
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class _Retryable(Exception):
    """A failure worth another attempt; ``wait_s`` overrides the backoff (Retry-After)."""

    def __init__(self, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.wait_s = wait_s


@dataclass
class FetchStats:
    """Counters for ``--verbose``: every HTTP request made and every body byte read."""

    requests: int = 0
    bytes_fetched: int = 0
    retries: int = 0
    extra_requests: int = 0  # second ranges for headers longer than predicted
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, requests: int = 0, nbytes: int = 0, retries: int = 0, extra: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_fetched += nbytes
            self.retries += retries
            self.extra_requests += extra

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes_fetched": self.bytes_fetched, "retries": self.retries,
                "extra_requests": self.extra_requests}


class RangeClient:
    """Ranged GETs over per-thread keep-alive connections (sources/http_conn.py says why not httpx).

    Args:
        repo_id: named in every error message.
        headers: auth / user-agent headers (``huggingface_hub.utils.build_hf_headers``).
        timeout: seconds per request (connect and read).
        attempts: tries per request before giving up.
        backoff_s: first backoff; doubled per retry, with jitter.
    """

    def __init__(self, repo_id: str, headers: dict[str, str], *, timeout: float, stats: FetchStats,
                 attempts: int | None = None, backoff_s: float | None = None) -> None:
        self.repo_id = repo_id
        self.headers = dict(headers)
        self.timeout = timeout
        self.stats = stats
        self.attempts = max(1, attempts if attempts is not None else DEFAULT_ATTEMPTS)
        self.backoff_s = backoff_s if backoff_s is not None else DEFAULT_BACKOFF_S
        self.pool = ConnectionPool(timeout)

    def get(self, url: str, filename: str, start: int, end: int, *, meta: dict[str, str] | None = None) -> bytes:
        """Bytes ``[start, end]`` (inclusive) of ``url``; may be shorter if the server sent less.

        ``meta``, when given, receives the first value seen of each response header in META_HEADERS
        (lower-case keys), across redirects: the Hub puts X-Repo-Commit and the etags on the first hop.

        Raises:
            AccessError: 401 / 403.  NotFoundError: 404.  NetworkError: anything else after retries.
        """
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                return self._once(url, filename, start, end, meta)
            except _Retryable as exc:
                last = str(exc)
                if attempt == self.attempts:
                    break
                self.stats.add(retries=1)
                delay = exc.wait_s if exc.wait_s is not None else self.backoff_s * 2 ** (attempt - 1)
                time.sleep(min(delay, MAX_RETRY_AFTER_S) * (1 + 0.1 * random.random()))
        raise NetworkError(f"{last} (bytes={start}-{end}, gave up after {self.attempts} attempts)",
                           path=f"{self.repo_id}/{filename}")

    def close(self) -> None:
        self.pool.close_all()

    def rest(self, url: str, filename: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) in as few ranges as the server allows; counts each as an extra request."""
        parts: list[bytes] = []
        while start < stop:
            more = self.get(url, filename, start, stop - 1)
            self.stats.add(extra=1)
            if not more:
                raise NetworkError(f"server sent no bytes for bytes={start}-{stop - 1}",
                                   path=f"{self.repo_id}/{filename}")
            parts.append(more)
            start += len(more)
        return b"".join(parts)

    def _once(self, url: str, filename: str, start: int, end: int, meta: dict[str, str] | None) -> bytes:
        headers = {**self.headers, "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        for _ in range(MAX_REDIRECTS + 1):
            origin = Origin.of(url)
            try:
                resp = self._send(origin, url, headers)
                self.stats.add(requests=1)
                status = resp.status
                if meta is not None:
                    for key in META_HEADERS:
                        if key not in meta and resp.getheader(key) is not None:
                            meta[key] = resp.getheader(key)
                if status in REDIRECTS and resp.getheader("Location"):
                    self._finish_small(origin, resp)
                    url, headers = redirect_target(url, resp.getheader("Location"), headers)
                    continue
                if status not in (200, 206):
                    self._finish_small(origin, resp)
                    self._raise_for(status, resp, filename)
                return self._body(origin, resp, status, start, end)
            except (socket.timeout, TimeoutError):
                self.pool.discard(origin)
                raise _Retryable(f"timed out after {self.timeout:g} s") from None
            except (http.client.HTTPException, OSError) as exc:  # resets, refused, broken status lines
                self.pool.discard(origin)
                raise _Retryable(f"connection error: {type(exc).__name__}: {_short(exc)}") from None
        raise _Retryable(f"more than {MAX_REDIRECTS} redirects")

    def _send(self, origin: Origin, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        route = self.pool.get(origin)
        target = url if route.absolute else request_target(url)
        route.conn.request("GET", target, headers={**headers, **route.extra_headers})
        return route.conn.getresponse()

    def _body(self, origin: Origin, resp: http.client.HTTPResponse, status: int, start: int, end: int) -> bytes:
        """The asked bytes of a 200 / 206 body, never reading past them."""
        want = end - start + 1
        declared = resp.getheader("Content-Length")
        data = b""
        try:
            skip = _check_content_range(resp.getheader("Content-Range"), start, end) if status == 206 else start
            data = _read_at_most(resp, skip + want)  # a 200 is the whole file: this stops after the asked bytes
        finally:
            self.stats.add(nbytes=len(data))
            if not resp.isclosed():  # body left unread (a 200, or more than asked): drop the connection
                self.pool.discard(origin)
        if status == 206 and declared is not None and len(data) < min(int(declared), skip + want):
            self.pool.discard(origin)
            raise _Retryable(f"truncated body: {len(data)} of {declared} bytes")
        return data[skip:]

    def _finish_small(self, origin: Origin, resp: http.client.HTTPResponse) -> None:
        """Read a redirect / error body so the connection can be reused, unless it is large or unsized."""
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) <= ERROR_BODY_LIMIT:
            resp.read()
        else:
            self.pool.discard(origin)

    def _raise_for(self, status: int, resp: http.client.HTTPResponse, filename: str) -> None:
        where = f"{self.repo_id}/{filename}"
        if status in (401, 403):
            raise AccessError(f"HTTP {status}: gated or private repo; accept its terms on the Hub and "
                              "pass --token or set HF_TOKEN", path=where)
        if status == 404:
            raise NotFoundError("HTTP 404: file not found", path=where)
        if status in RETRY_STATUS:
            raise _Retryable(f"HTTP {status}", _retry_after(resp.getheader("Retry-After")))
        raise NetworkError(f"unexpected HTTP {status} for a range request", path=where)


def _read_at_most(resp: http.client.HTTPResponse, amount: int) -> bytes:
    """Up to ``amount`` body bytes. http.client preallocates ``amount`` unless the length is known, so a
    body of unknown length (no Content-Length, not chunked) is read in 1 MiB pieces."""
    if resp.length is not None or resp.chunked:
        return resp.read(amount)
    parts, have = [], 0
    while have < amount:
        part = resp.read(min(1 << 20, amount - have))
        if not part:
            break
        parts.append(part)
        have += len(part)
    return b"".join(parts)


def content_range_total(value: str | None) -> int | None:
    """The complete length a ``Content-Range: bytes a-b/N`` names, None when absent or ``*``."""
    match = _CONTENT_RANGE.match(value or "")
    return int(match.group(3)) if match is not None and match.group(3) != "*" else None


def _check_content_range(value: str | None, start: int, end: int) -> int:
    """Validate a 206's Content-Range against the range asked; return bytes to skip (always 0)."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:  # multipart/byteranges or a broken proxy
        raise _Retryable(f"206 without a usable Content-Range ({value!r})")
    first, last = int(match.group(1)), int(match.group(2))
    if first != start or last > end or last < first:
        raise _Retryable(f"wrong Content-Range {value!r} for bytes={start}-{end}")
    return 0


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:120]
