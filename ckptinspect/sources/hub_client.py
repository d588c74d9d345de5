"""Single-range GETs and the repo-info GET of the Hub reader, over one ``httpx`` client from
huggingface_hub's own factory (``huggingface_hub.get_async_session``: a user's ``set_async_client_factory``
applies here too), so endpoint, TLS trust (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, else the system store),
proxies (``HTTP(S)_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY``) and redirects (``Authorization`` dropped when a
redirect leaves the origin) are exactly those of the Hub client users already have.

Rules behind the code:

- HTTP ranges are inclusive: ``bytes=a-b`` is ``b - a + 1`` bytes; completeness is decided by the bytes
  received (the 100,000-byte off-by-one of huggingface/huggingface_hub#4602 came from mixing the two up).
- One range per request: the Hub answers multi-range requests with ``multipart/byteranges`` and no
  ``Content-Range`` (huggingface/huggingface_hub#2248).
- A server may ignore ``Range`` and answer ``200`` with the whole (multi-GB) file: the body is streamed
  and the stream closed as soon as the asked bytes are in, so weights are never downloaded.
- Timeouts, resets, 408 / 429 / 5xx (huggingface_hub's ``_DEFAULT_RETRY_ON_STATUS_CODES``) and bad
  ``Content-Range`` values are retried with exponential backoff a bounded number of times, then reported
  as one NetworkError line naming the repo and file; a ``Retry-After`` beyond what is left of the
  request's waiting allowance ends the request at once.
- Every request runs under ``asyncio.timeout`` for its whole exchange (redirect hops included) and draws
  from the command's deadline and byte budget (sources/net_limits.py).

The same client makes every other remote read of the tool (GGUF headers, the audit's listing and commit
checks, the probe's engine and main-model servers): ``make_client(budget, hub=False)`` is a plain
``httpx`` client for servers that are not the Hub (no Hugging Face auth headers, no Hub hooks), and
``get_document`` / ``post_document`` read any answer under the same bounds. Answers that are JSON are
decoded by sources/net_json.py (depth, size, NaN / Infinity refused).
"""

from __future__ import annotations

import asyncio
import importlib
import random
import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from ckptinspect.errors import AccessError, NetworkError, NotFoundError, SourceError
from ckptinspect.sources.net_limits import REQUEST_ENV, RETRY_WAIT_ENV, Budget
from ckptinspect.sources.redact import scrub
from ckptinspect.settings import DEFAULTS

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_ATTEMPTS = DEFAULTS.http_attempts  # the command's own: Settings.http_attempts (CKPTINSPECT_HTTP_ATTEMPTS)
DEFAULT_BACKOFF_S = DEFAULTS.http_backoff_s  # Settings.http_backoff_s (CKPTINSPECT_HTTP_BACKOFF_S)
MAX_REDIRECTS = 5
ERROR_BODY_LIMIT = 1 << 20
# Requests in flight at once to a server that closes the connection after every answer (HTTP/1.0, or
# Connection: close): there every request is a new connection that waits in the server's listen queue,
# and 20 at once overflow a small one (http.server's holds 5), each dropped SYN costing the kernel's 1 s
# retransmit. Keep-alive servers (the Hub, its CDN) are not affected.
CLOSING_SERVER_IN_FLIGHT = 5
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class _Retryable(Exception):
    """A failure worth another attempt; ``wait_s`` overrides the backoff (Retry-After)."""

    def __init__(self, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.wait_s = wait_s


@dataclass
class FetchStats:
    """Counters for ``--verbose``: HTTP requests made (redirect hops included) and body bytes read."""

    requests: int = 0
    bytes_fetched: int = 0
    retries: int = 0
    extra_requests: int = 0  # second ranges for headers longer than predicted

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes_fetched": self.bytes_fetched, "retries": self.retries,
                "extra_requests": self.extra_requests}


def httpx_module() -> Any:
    """huggingface_hub's HTTP library: ``httpx2`` from huggingface_hub 2.x, ``httpx`` before."""
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
        import httpx  # type: ignore[no-redef]
    return httpx


# Bytes one socket read of an HTTP/1.1 answer may take. httpcore reads 64 KiB at a time
# (``AsyncHTTP11Connection.READ_NUM_BYTES``, a class attribute its connections read through ``self``), and
# every read is a round trip through anyio and h11 on the event loop: a report receives ~90 MB (the 41 MB
# index and 51 MB of headers of the 397B replica), ~1,500 such reads. Allowing 1 MiB lets a read take what
# the socket holds (asyncio's transport hands over up to 256 KiB at once); BENCHMARKS.md has the paired run.
READ_BYTES = 1 << 20


def http11_connection(httpx: Any) -> Any:
    """The async HTTP/1.1 connection class of ``httpx``'s httpcore (``httpcore2`` under ``httpx2``), or None."""
    try:
        return importlib.import_module({"httpx2": "httpcore2"}.get(httpx.__name__, "httpcore")).AsyncHTTP11Connection
    except (ImportError, AttributeError):  # pragma: no cover - another httpcore: its own read size
        return None


def _read_in_larger_pieces(httpx: Any) -> None:
    """Raise httpcore's per-read size to READ_BYTES (for every connection of the process: the only other
    HTTP client in it is huggingface_hub's, on the same library). Nothing is changed when the installed
    httpcore has no such attribute (tests/test_hub_transport.py checks that the locked one has it)."""
    connection = http11_connection(httpx)
    if isinstance(getattr(connection, "READ_NUM_BYTES", None), int) and connection.READ_NUM_BYTES < READ_BYTES:
        connection.READ_NUM_BYTES = READ_BYTES


def make_client(budget: Budget, *, hub: bool = True) -> Any:
    """An ``AsyncClient`` with this command's connect / read timeouts: from huggingface_hub's factory for
    the Hub, else a plain one (an inference server must not get the Hub's hooks or headers)."""
    httpx = httpx_module()
    _read_in_larger_pieces(httpx)
    if hub:
        from huggingface_hub import get_async_session

        client = get_async_session()
    else:
        client = httpx.AsyncClient(trust_env=True)
    limits = budget.limits
    client.timeout = httpx.Timeout(limits.read_s, connect=limits.connect_s)
    client.follow_redirects = True
    client.max_redirects = MAX_REDIRECTS
    return client


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (read as httpx reads it: urllib's getproxies), for
    error messages; None when none applies."""
    import urllib.request  # ~10 ms to import, and only an error message needs it

    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


class HubClient:
    """Ranged and plain requests for one repo (or one server), under one command's budget.

    Args:
        client: an ``AsyncClient`` (``make_client``), closed by the caller.
        repo_id: named in every error message (for a server that is not the Hub: its redacted URL).
        headers: auth / user-agent headers (``huggingface_hub.utils.build_hf_headers``).
        attempts / backoff_s: tries per request, and the first backoff (doubled per retry, with jitter).
        limiter: an ``asyncio.Semaphore`` bounding the requests in flight of every read on this event loop
            (the audit's), or None.
    """

    def __init__(self, client: Any, repo_id: str, headers: Mapping[str, str], *, budget: Budget,
                 stats: FetchStats, attempts: int | None = None, backoff_s: float | None = None, secrets: tuple[str, ...] = (),
                 limiter: Any = None) -> None:
        self.client = client
        self.repo_id = repo_id
        self.headers = dict(headers)
        self.budget = budget
        self.limits = budget.limits
        self.stats = stats
        self.attempts = max(1, attempts if attempts is not None else DEFAULT_ATTEMPTS)
        self.backoff_s = backoff_s if backoff_s is not None else DEFAULT_BACKOFF_S
        self.secrets = tuple(s for s in secrets if s)
        self.httpx = httpx_module()
        self.closing = False  # the server closed a connection after an answer: few connects at once
        self.closing_gate = asyncio.Semaphore(CLOSING_SERVER_IN_FLIGHT)
        self.limiter: asyncio.Semaphore | None = limiter

    async def get_range(self, url: str, name: str, start: int, end: int, *, ranges_required: bool = False) -> bytes:
        """Bytes ``[start, end]`` (inclusive) of ``url``; may be shorter if the server sent less.
        ``ranges_required``: a ``200`` (the server ignored ``Range``) or a wrong ``Content-Range`` is refused
        at once instead of cut short or retried.

        Raises:
            AccessError: 401 / 403.  NotFoundError: 404.  NetworkError: anything else after retries,
            and the command's deadline or byte budget (never retried).
        """
        # A range beyond what is left of the byte budget is never asked for: its answer could not be kept.
        self.budget.reserve(end - start + 1, f"{self.repo_id}/{name}")
        headers = {**self.headers, "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}

        async def answer(resp: Any) -> bytes:
            status = resp.status_code
            if status not in (200, 206):
                await self._read(resp, ERROR_BODY_LIMIT, name)
                self._raise_for(status, resp, name)
            if status == 200 and ranges_required:
                raise SourceError(f"the server answered 200 to a range request for bytes {start:,}-{end:,} "
                                  "(ranges are required: tensor data is never downloaded)",
                                  path=f"{self.repo_id}/{name}")
            try:
                skip = self._check_content_range(resp.headers.get("content-range"), start, end) if status == 206 else start
            except _Retryable as exc:
                if not ranges_required:
                    raise
                raise SourceError(str(exc), path=f"{self.repo_id}/{name}") from None
            data = await self._read(resp, skip + end - start + 1, name)  # a 200 is the whole file: stop early
            declared = resp.headers.get("content-length")
            if status == 206 and declared is not None and declared.isdigit() and len(data) < int(declared):
                raise _Retryable(f"truncated body: {len(data)} of {declared} bytes")
            return data[skip:]

        return await self._with_retries(url, name, headers, answer, f"bytes={start}-{end}")

    async def rest(self, url: str, name: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) in as few ranges as the server allows; counts each as an extra request."""
        parts: list[bytes] = []
        while start < stop:
            more = await self.get_range(url, name, start, stop - 1)
            self.stats.extra_requests += 1
            if not more:
                raise NetworkError(f"server sent no bytes for bytes={start}-{stop - 1}", path=f"{self.repo_id}/{name}")
            parts.append(more)
            start += len(more)
        return b"".join(parts)

    async def get_document(self, url: str, name: str, headers: Mapping[str, str], limit: int, *,
                           method: str = "GET", content: bytes | None = None,
                           retry: bool = True) -> tuple[int, dict[str, str], bytes]:
        """A plain request (the repo-info call, a listing page, an engine's answer): status, lower-cased
        response headers, at most ``limit`` body bytes (more is an error, read no further). 408 / 429 / 5xx
        are retried (``retry``: a POST that generates is not); after the last attempt that answer is
        returned, so the caller maps it with its own error rules."""
        last: list[tuple[int, dict[str, str], bytes]] = []

        async def answer(resp: Any) -> tuple[int, dict[str, str], bytes]:
            body = await self._read(resp, limit + 1, name)
            if len(body) > limit:
                raise NetworkError(f"answer is over the {limit:,} byte limit", path=f"{self.repo_id}/{name}")
            out = (resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, body)
            if resp.status_code in RETRY_STATUS and retry:
                last[:] = [out]
                raise _Retryable(f"HTTP {resp.status_code}", _retry_after(resp.headers.get("retry-after")))
            return out

        try:
            return await self._with_retries(url, name, {**self.headers, "Accept-Encoding": "identity", **headers},
                                            answer, "", method=method, content=content)
        except NetworkError:
            if last and self.budget.left_s() > 0:
                return last[0]
            raise

    # -- one request, retried ----------------------------------------------------------------------
    async def _with_retries(self, url: str, name: str, headers: dict[str, str], answer: Any, what: str, *,
                            method: str = "GET", content: bytes | None = None) -> Any:
        where = f"{self.repo_id}/{name}"
        last = ""
        waited = 0.0
        for attempt in range(1, self.attempts + 1):
            self.budget.check_time(where)
            try:
                return await self._exchange(url, name, headers, answer, method, content)
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
                self.stats.retries += 1
                await asyncio.sleep(delay)
                waited += delay
        raise NetworkError(f"{last} ({what + ', ' if what else ''}gave up after {self.attempts} attempts)", path=where)

    async def _exchange(self, url: str, name: str, headers: dict[str, str], answer: Any, method: str,
                        content: bytes | None) -> Any:
        """One request, holding a slot of the shared bound on requests in flight when there is one (the
        wait for it is bounded by the command's deadline, not by the request's)."""
        if self.limiter is None:
            return await self._exchange_now(url, name, headers, answer, method, content)
        where = f"{self.repo_id}/{name}"
        try:
            async with asyncio.timeout(max(0.0, self.budget.left_s())):
                await self.limiter.acquire()
        except TimeoutError:
            raise self.budget.deadline_error(where) from None
        try:
            return await self._exchange_now(url, name, headers, answer, method, content)
        finally:
            self.limiter.release()

    async def _exchange_now(self, url: str, name: str, headers: dict[str, str], answer: Any, method: str = "GET",
                            content: bytes | None = None) -> Any:
        """One request (redirects followed by httpx) under the request deadline and the command's."""
        httpx = self.httpx
        where = f"{self.repo_id}/{name}"
        limit = min(self.limits.request_s, self.budget.left_s())
        try:
            async with asyncio.timeout(max(0.0, limit)):
                return await self._send_gated(url, headers, answer, method, content)
        except TimeoutError:
            if self.budget.left_s() <= 0:
                raise self.budget.deadline_error(where) from None
            raise _Retryable(f"no complete answer within {self.limits.request_s:g} s ({REQUEST_ENV})") from None
        except httpx.TooManyRedirects:
            raise _Retryable(f"more than {MAX_REDIRECTS} redirects") from None
        except httpx.UnsupportedProtocol as exc:  # a redirect to file:, ftp:, ...: never followed
            raise NetworkError(f"redirected to a location that is not an http(s) URL ({self._short(exc)})",
                               path=where) from None
        except httpx.ProxyError as exc:
            raise self._proxy_error(url, where, exc) from None
        except httpx.ConnectError as exc:
            proxy = proxy_for(url)
            if proxy is not None:
                raise self._proxy_error(url, where, exc) from None
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):  # retrying cannot help
                raise NetworkError(f"TLS certificate not trusted ({self._short(exc)})", path=where,
                                   hint="the CA must be in the system store, or named by SSL_CERT_FILE / "
                                        "SSL_CERT_DIR, as for huggingface_hub") from None
            raise _Retryable(f"connection error: {self._root_cause(exc)}") from None
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out ({type(exc).__name__}) after {self.limits.read_s:g} s") from None
        except httpx.RemoteProtocolError as exc:
            if "location header" in str(exc):  # a redirect to javascript:, a bare word: never followed
                raise NetworkError(f"redirected to a location that is not an http(s) URL ({self._short(exc)})",
                                   path=where) from None
            if "complete message body" in str(exc):  # the connection closed before Content-Length bytes
                raise _Retryable(f"truncated body: {self._short(exc)}") from None
            raise _Retryable(f"connection error: {type(exc).__name__}: {self._short(exc)}") from None
        except httpx.NetworkError as exc:
            raise _Retryable(f"connection error: {type(exc).__name__}: {self._short(exc)}") from None

    async def _send_gated(self, url: str, headers: dict[str, str], answer: Any, method: str,
                          content: bytes | None) -> Any:
        if not self.closing:
            return await self._send(url, headers, answer, method, content)
        async with self.closing_gate:
            return await self._send(url, headers, answer, method, content)

    async def _send(self, url: str, headers: dict[str, str], answer: Any, method: str = "GET",
                    content: bytes | None = None) -> Any:
        async with self.client.stream(method, url, headers=headers, content=content) as resp:
            self.stats.requests += 1 + len(resp.history)
            if resp.http_version == "HTTP/1.0" or resp.headers.get("connection", "").lower() == "close":
                self.closing = True
            return await answer(resp)

    def _proxy_error(self, url: str, where: str, exc: BaseException) -> NetworkError:
        proxy = proxy_for(url)
        named = scrub(proxy, self.secrets) if proxy else "the configured proxy"
        return NetworkError(f"cannot reach the Hub through the proxy {named}: {self._short(exc)}", path=where,
                            hint="the proxy, not the endpoint, failed; check HTTP(S)_PROXY / NO_PROXY")

    async def _read(self, resp: Any, amount: int, name: str) -> bytes:
        """Up to ``amount`` body bytes, each piece counted (``--verbose``, the byte budget) as it arrives."""
        have = 0
        where = f"{self.repo_id}/{name}"
        try:  # huggingface_hub's response hook reads error bodies under 1 MB itself
            read = resp.content
        except self.httpx.ResponseNotRead:
            pass
        else:
            self.stats.bytes_fetched += len(read)
            self.budget.take(len(read), where)
            return read[:amount]
        async for part in resp.aiter_raw():
            if not have:
                buf = bytearray(part)  # one buffer grown in place: a large answer is held once, not twice
            else:
                buf += part
            have += len(part)
            self.stats.bytes_fetched += len(part)
            self.budget.take(len(part), where)
            if have > amount:  # more than asked (a 200 with the whole file): stop, dropping the connection
                break
        # Exactly what was asked is read to the end of the answer, so the connection stays reusable.
        if not have:
            return b""
        del buf[amount:]
        return bytes(buf)

    def _raise_for(self, status: int, resp: Any, name: str) -> None:
        where = f"{self.repo_id}/{name}"
        if status in (401, 403):
            raise AccessError(f"HTTP {status}: gated or private repo; accept its terms on the Hub and "
                              "pass --token or set HF_TOKEN", path=where)
        if status == 404:
            raise NotFoundError("HTTP 404: file not found", path=where)
        if status in RETRY_STATUS:
            raise _Retryable(f"HTTP {status}", _retry_after(resp.headers.get("retry-after")))
        raise NetworkError(f"unexpected HTTP {status} for a range request", path=where)

    @staticmethod
    def _check_content_range(value: str | None, start: int, end: int) -> int:
        """Validate a 206's ``Content-Range`` against the range asked; bytes to skip (always 0)."""
        match = _CONTENT_RANGE.match(value or "")
        if match is None:  # multipart/byteranges or a broken proxy
            raise _Retryable(f"206 without a usable Content-Range ({(value or '')[:60]!r})")
        first, last = int(match.group(1)), int(match.group(2))
        if first != start or last > end or last < first:
            raise _Retryable(f"wrong Content-Range: asked for bytes={start}-{end}, got {value[:60]!r}")
        return 0

    def _root_cause(self, exc: BaseException) -> str:
        """The innermost socket error under httpx's ("ConnectionRefusedError: ..." rather than "All
        connection attempts failed"), named by its type; an unrelated error that was being handled when it
        happened (its ``__context__``) is not it."""
        chain, inner = [exc], exc
        while (inner.__cause__ or inner.__context__) is not None and len(chain) < 10:
            inner = inner.__cause__ or inner.__context__
            chain.append(inner)
        inner = next((e for e in reversed(chain) if isinstance(e, OSError)), chain[-1])
        return f"{type(inner).__name__}: {self._short(inner)}"

    def _short(self, exc: BaseException) -> str:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return scrub(text, self.secrets)[:160]


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delay form; an HTTP date or garbage gives None)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
