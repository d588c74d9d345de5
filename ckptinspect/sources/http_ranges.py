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
  line naming the repo and file. A request sleeps at most CKPTINSPECT_RETRY_WAIT_S (30 s) in all: a
  ``Retry-After`` beyond what is left of that ends the request at once instead of being slept in part.
- Every request has a deadline for its whole answer, and draws from the command's deadline and byte
  budget (sources/net_limits.py).
"""

from __future__ import annotations

import http.client
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

from ckptinspect.errors import AccessError, NetworkError, NotFoundError
from ckptinspect.sources.http_fields import content_range, retry_after_s
from ckptinspect.sources.http_conn import (MAX_REDIRECTS, REDIRECTS, ConnectionPool, Origin, Route,
                                           redirect_target, request_target)
from ckptinspect.sources.net_limits import REQUEST_ENV, RETRY_WAIT_ENV, Budget, NetLimits, Watchdog

T = TypeVar("T")

# Retried like huggingface_hub's http_backoff does (utils/_http.py _DEFAULT_RETRY_ON_STATUS_CODES).
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_ATTEMPTS = int(os.environ.get("CKPTINSPECT_HTTP_ATTEMPTS", "4"))
DEFAULT_BACKOFF_S = float(os.environ.get("CKPTINSPECT_HTTP_BACKOFF_S", "0.25"))
META_HEADERS = ("x-repo-commit", "x-linked-etag", "etag", "content-range")
ERROR_BODY_LIMIT = 1 << 20  # error / redirect bodies read to keep the connection; larger ones close it
READ_PIECE = 1 << 20  # body bytes asked of one socket read at most
# Requests in flight at once to a server that closes the connection after every answer (HTTP/1.0, or
# Connection: close). There every request is a new connection, and a connection waits in the server's
# listen queue until the server accepts it: 32 at once overflow a small queue (http.server's holds 5),
# and each dropped SYN costs the kernel's 1 s retransmit (measured: 16-24 of 97 connects took 1.03 s
# against tests/plain_hub_server.py with 32 workers, none with 5 in flight). Keep-alive servers (the
# Hub, its CDN) are not affected: each thread connects once.
CLOSING_SERVER_IN_FLIGHT = 5


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

    Every request runs under the limits of ``budget`` (sources/net_limits.py): a connect timeout, a
    timeout per socket read, a deadline for the whole response (a watchdog shuts the socket down when it
    passes), the command's deadline, and its byte budget, which every body byte read is charged to.

    Args:
        repo_id: named in every error message.
        headers: auth / user-agent headers (``huggingface_hub.utils.build_hf_headers``).
        timeout: seconds per socket read (the first byte of an answer, and each read after it).
        attempts: tries per request before giving up.
        backoff_s: first backoff; doubled per retry, with jitter.
        budget: the command's deadline and byte budget (default: a fresh one from the environment).
    """

    def __init__(self, repo_id: str, headers: dict[str, str], *, timeout: float, stats: FetchStats,
                 attempts: int | None = None, backoff_s: float | None = None, budget: Budget | None = None) -> None:
        self.repo_id = repo_id
        self.headers = dict(headers)
        self.budget = budget if budget is not None else Budget(NetLimits.from_env(read_s=timeout))
        self.limits = self.budget.limits
        self.timeout = timeout
        self.stats = stats
        self.attempts = max(1, attempts if attempts is not None else DEFAULT_ATTEMPTS)
        self.backoff_s = backoff_s if backoff_s is not None else DEFAULT_BACKOFF_S
        self.pool = ConnectionPool(self.limits.connect_s)
        self.watchdog = Watchdog()
        self._closing: set[Origin] = set()  # origins seen closing the connection after an answer
        self._closing_gate = threading.BoundedSemaphore(CLOSING_SERVER_IN_FLIGHT)

    def get(self, url: str, filename: str, start: int, end: int, *, meta: dict[str, str] | None = None) -> bytes:
        """Bytes ``[start, end]`` (inclusive) of ``url``; may be shorter if the server sent less.

        ``meta``, when given, receives the first value seen of each response header in META_HEADERS
        (lower-case keys), across redirects: the Hub puts X-Repo-Commit and the etags on the first hop.

        Raises:
            AccessError: 401 / 403.  NotFoundError: 404.  NetworkError: anything else after retries,
            and the command's deadline or byte budget (never retried).
        """
        headers = {**self.headers, "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}

        def answer(origin: Origin, resp: http.client.HTTPResponse, status: int) -> bytes:
            if status not in (200, 206):
                self._finish_small(origin, resp, filename)
                self._raise_for(status, resp, filename)
            return self._body(origin, resp, status, start, end, filename)

        return self._with_retries(url, filename, headers, answer, meta, f"bytes={start}-{end}")

    def get_document(self, url: str, name: str, headers: Mapping[str, str],
                     limit: int) -> tuple[int, dict[str, str], bytes]:
        """A plain GET (the repo-info call): status, lower-cased response headers, at most ``limit`` body bytes.

        408 / 429 / 5xx are retried like ranges; after the last attempt that answer is returned, so the
        caller maps it with huggingface_hub's own error rules.
        """
        last: list[tuple[int, dict[str, str], bytes]] = []

        def answer(origin: Origin, resp: http.client.HTTPResponse, status: int) -> tuple[int, dict[str, str], bytes]:
            body = self._read_body(resp, limit + 1, name)
            if not resp.isclosed():
                self.pool.discard(origin)
            if len(body) > limit:
                raise NetworkError(f"answer is over the {limit:,} byte limit", path=f"{self.repo_id}/{name}")
            out = (status, {k.lower(): v for k, v in resp.getheaders()}, body)
            if status in RETRY_STATUS:
                last[:] = [out]
                raise _Retryable(f"HTTP {status}", retry_after_s(resp.getheader("Retry-After")))
            return out

        try:
            return self._with_retries(url, name, {**self.headers, "Accept-Encoding": "identity", **headers}, answer,
                                      None, "")
        except NetworkError:
            if last and self.budget.left_s() > 0:
                return last[0]
            raise

    def close(self) -> None:
        self.watchdog.close()
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

    # -- one request, retried ----------------------------------------------------------------------
    def _with_retries(self, url: str, filename: str, headers: dict[str, str], answer: Callable[..., T],
                      meta: dict[str, str] | None, what: str) -> T:
        where = f"{self.repo_id}/{filename}"
        last = ""
        waited = 0.0
        for attempt in range(1, self.attempts + 1):
            self.budget.check_time(where)
            try:
                return self._exchange(url, filename, headers, answer, meta)
            except _Retryable as exc:
                last = str(exc)
                if attempt == self.attempts:
                    break
                delay = exc.wait_s if exc.wait_s is not None else (
                    self.backoff_s * 2 ** (attempt - 1) * (1 + 0.1 * random.random()))
                if waited + delay > self.limits.retry_wait_s:
                    # A long Retry-After is not slept off in part: the answer would be the same error, later.
                    raise NetworkError(f"{last}; retrying after {delay:g} s would pass the "
                                       f"{self.limits.retry_wait_s:g} s a request may spend waiting"
                                       + (f" ({what})" if what else ""),
                                       path=where, hint=f"{RETRY_WAIT_ENV} raises it") from None
                if delay >= self.budget.left_s():
                    raise self.budget.deadline_error(where) from None
                self.stats.add(retries=1)
                time.sleep(delay)
                waited += delay
        raise NetworkError(f"{last} ({what + ', ' if what else ''}gave up after {self.attempts} attempts)", path=where)

    def _exchange(self, url: str, filename: str, headers: dict[str, str], answer: Callable[..., T],
                  meta: dict[str, str] | None) -> T:
        """One request, following redirects, each hop under the request deadline and the command's."""
        where = f"{self.repo_id}/{filename}"
        for _ in range(MAX_REDIRECTS + 1):
            origin = Origin.of(url)
            self.budget.check_time(where)
            gate = self._gate(origin, where)
            try:
                outcome = self._hop_guarded(origin, url, filename, headers, meta, answer, gate)
            finally:
                gate.release()
            if isinstance(outcome, _Redirect):
                try:
                    url, headers = redirect_target(url, outcome.location, headers)
                except ValueError:  # file:, ftp:, a URL without a host: never followed
                    raise NetworkError(f"redirected to {outcome.location[:100]!r}, not an http(s) URL",
                                       path=where) from None
                continue
            return outcome
        raise _Retryable(f"more than {MAX_REDIRECTS} redirects")

    def _hop_guarded(self, origin: Origin, url: str, filename: str, headers: dict[str, str],
                     meta: dict[str, str] | None, answer: Callable[..., T], gate: "_Gate") -> "T | _Redirect":
        """Connect if needed, then one hop under the watchdog; every failure mapped to retry or not."""
        where = f"{self.repo_id}/{filename}"
        try:
            route = self._route(origin)
        except (socket.timeout, TimeoutError):
            self.pool.discard(origin)
            raise _Retryable(f"connect timed out after {self.limits.connect_s:g} s") from None
        except (http.client.HTTPException, OSError) as exc:
            self.pool.discard(origin)
            raise _Retryable(f"connection error: {type(exc).__name__}: {_short(exc)}") from None
        token = self.watchdog.arm(min(time.monotonic() + self.limits.request_s, self.budget.ends_at), route.conn)
        try:
            outcome = self._hop(route, origin, url, filename, headers, meta, answer, gate)
        except BaseException as exc:
            if self.watchdog.disarm(token):  # whatever the shutdown made the read raise
                self.pool.discard(origin)
                raise self._expired(where) from None
            if isinstance(exc, (socket.timeout, TimeoutError)):
                self.pool.discard(origin)
                raise _Retryable(f"timed out after {self.timeout:g} s") from None
            if isinstance(exc, (http.client.HTTPException, OSError)):  # resets, refused, broken status lines
                self.pool.discard(origin)
                raise _Retryable(f"connection error: {type(exc).__name__}: {_short(exc)}") from None
            raise
        if self.watchdog.disarm(token):  # an unsized body looks complete after the shutdown's end-of-file
            self.pool.discard(origin)
            raise self._expired(where)
        return outcome

    def _gate(self, origin: Origin, where: str) -> "_Gate":
        """A place among the requests in flight to a server that closes every connection (else a no-op)."""
        if origin not in self._closing:
            return _Gate(None)
        if not self._closing_gate.acquire(timeout=max(0.0, self.budget.left_s())):
            raise self.budget.deadline_error(where)
        return _Gate(self._closing_gate)

    def _expired(self, where: str) -> Exception:
        if self.budget.left_s() <= 0:
            return self.budget.deadline_error(where)
        return _Retryable(f"no complete answer within {self.limits.request_s:g} s ({REQUEST_ENV})")

    def _route(self, origin: Origin) -> Route:
        """This thread's connection to ``origin``, connected here so that the connect timeout covers the
        connect (and TLS handshake) alone, then reading with the per-read timeout."""
        route = self.pool.get(origin)
        if route.conn.sock is None:
            route.conn.timeout = max(0.001, min(self.limits.connect_s, self.budget.left_s()))
            route.conn.connect()
            route.conn.sock.settimeout(self.timeout)
        return route

    def _hop(self, route: Route, origin: Origin, url: str, filename: str, headers: dict[str, str],
             meta: dict[str, str] | None, answer: Callable[..., T], gate: "_Gate") -> "T | _Redirect":
        target = url if route.absolute else request_target(url)
        route.conn.request("GET", target, headers={**headers, **route.extra_headers})
        resp = route.conn.getresponse()
        gate.release()  # the server has accepted the connection: the body may take its time
        self.stats.add(requests=1)
        if resp.will_close:
            self._closing.add(origin)
        status = resp.status
        if meta is not None:
            for key in META_HEADERS:
                if key not in meta and resp.getheader(key) is not None:
                    meta[key] = resp.getheader(key)
        location = resp.getheader("Location")
        if status in REDIRECTS and location:
            self._finish_small(origin, resp, filename)
            return _Redirect(location)
        return answer(origin, resp, status)

    def _body(self, origin: Origin, resp: http.client.HTTPResponse, status: int, start: int, end: int,
              filename: str) -> bytes:
        """The asked bytes of a 200 / 206 body, never reading past them."""
        want = end - start + 1
        declared = resp.getheader("Content-Length")
        data = b""
        try:
            skip = _check_content_range(resp.getheader("Content-Range"), start, end) if status == 206 else start
            data = self._read_body(resp, skip + want, filename)  # a 200 is the whole file: stop after the asked bytes
        finally:
            if not resp.isclosed():  # body left unread (a 200, or more than asked): drop the connection
                self.pool.discard(origin)
        if status == 206 and declared is not None and declared.isdigit() and len(data) < min(int(declared),
                                                                                            skip + want):
            self.pool.discard(origin)
            raise _Retryable(f"truncated body: {len(data)} of {declared} bytes")
        return data[skip:]

    def _read_body(self, resp: http.client.HTTPResponse, amount: int, filename: str) -> bytes:
        """Up to ``amount`` body bytes, a piece at a time: each piece is counted (``--verbose`` and the
        command's byte budget) as it arrives, and nothing is allocated for a length the server only claims."""
        parts, have = [], 0
        where = f"{self.repo_id}/{filename}"
        while have < amount:
            part = resp.read1(min(READ_PIECE, amount - have))
            if not part:
                break
            parts.append(part)
            have += len(part)
            self.stats.add(nbytes=len(part))
            self.budget.take(len(part), where)
        return b"".join(parts)

    def _finish_small(self, origin: Origin, resp: http.client.HTTPResponse, filename: str) -> None:
        """Read a redirect / error body so the connection can be reused, unless it is large or unsized."""
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) <= ERROR_BODY_LIMIT:
            self._read_body(resp, int(length), filename)
            if resp.isclosed():
                return
        self.pool.discard(origin)

    def _raise_for(self, status: int, resp: http.client.HTTPResponse, filename: str) -> None:
        where = f"{self.repo_id}/{filename}"
        if status in (401, 403):
            raise AccessError(f"HTTP {status}: gated or private repo; accept its terms on the Hub and "
                              "pass --token or set HF_TOKEN", path=where)
        if status == 404:
            raise NotFoundError("HTTP 404: file not found", path=where)
        if status in RETRY_STATUS:
            raise _Retryable(f"HTTP {status}", retry_after_s(resp.getheader("Retry-After")))
        raise NetworkError(f"unexpected HTTP {status} for a range request", path=where)


@dataclass(frozen=True)
class _Redirect:
    location: str


class _Gate:
    """A held semaphore place, released once (or nothing to release)."""

    def __init__(self, semaphore: threading.BoundedSemaphore | None) -> None:
        self._semaphore = semaphore

    def release(self) -> None:
        if self._semaphore is not None:
            self._semaphore.release()
            self._semaphore = None


def _check_content_range(value: str | None, start: int, end: int) -> int:
    """Validate a 206's Content-Range against the range asked; return bytes to skip (always 0)."""
    parsed = content_range(value)
    if parsed is None:  # multipart/byteranges or a broken proxy
        raise _Retryable(f"206 without a usable Content-Range ({value!r})")
    first, last, _ = parsed
    if first != start or last > end or last < first:
        raise _Retryable(f"wrong Content-Range {value!r} for bytes={start}-{end}")
    return 0


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:120]
