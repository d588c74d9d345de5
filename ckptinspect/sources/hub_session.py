"""What every remote read of one command shares: the endpoint, the auth headers, the secrets to keep out
of every message, and the deadline and byte budget (sources/net_limits.py); ``open`` gives a bounded
client (sources/hub_client.py) for one repo or server.

``hub_session`` is the Hub's (huggingface_hub's client factory and auth headers: a report, a GGUF read,
the audit's listing and commit checks); ``server_session`` is an inference server's (the probe's
``--engine`` and ``--main-url``: a plain client, no Hugging Face token ever sent there). A password in
a URL (``HF_ENDPOINT=https://user:pass@host``, ``--engine http://user:pass@host``) is used to connect and
never printed or written: it is one of the session's secrets, and every place that shows a URL shows
``redact_url``'s form.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator
from urllib.parse import unquote, urlsplit

from ckptinspect.errors import CkptInspectError, NetworkError
from ckptinspect.sources.hub_client import FetchStats, HubClient, make_client
from ckptinspect.sources.net_limits import Budget, NetLimits
from ckptinspect.sources.redact import redact_url, scrub
from ckptinspect.settings import DEFAULTS, Settings


def hub_endpoint(endpoint: str | None = None) -> str:
    """The Hub endpoint: the argument (the settings' HF_ENDPOINT, ckptinspect/settings.py), else
    huggingface_hub's own (``constants.ENDPOINT``: HF_ENDPOINT as huggingface_hub read it, else
    https://huggingface.co)."""
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def url_secrets(url: str) -> tuple[str, ...]:
    """The user name and password a URL carries (as typed and percent-decoded): never shown."""
    parts = urlsplit(url)
    found = [parts.password, parts.username] if "@" in parts.netloc else []
    return tuple(s for value in found if value for s in {value, unquote(value)})


@dataclass
class HubSession:
    endpoint: str
    headers: dict[str, str]
    secrets: tuple[str, ...]
    budget: Budget
    hub: bool = True
    stats: FetchStats = field(default_factory=FetchStats)
    attempts: int | None = None  # tries per request (Settings.http_attempts); None: HubClient's default
    backoff_s: float | None = None  # the first backoff (Settings.http_backoff_s)

    @contextlib.asynccontextmanager
    async def open(self, label: str, limiter: asyncio.Semaphore | None = None) -> AsyncIterator[HubClient]:
        """A client for ``label`` (a repo id, or a server's redacted URL), closed on the way out."""
        client = make_client(self.budget, hub=self.hub)
        async with client:
            yield HubClient(client, label, self.headers, budget=self.budget, stats=self.stats,
                            attempts=self.attempts, backoff_s=self.backoff_s, secrets=self.secrets, limiter=limiter)

    def scrubbed(self, exc: CkptInspectError) -> CkptInspectError:
        """``exc``, or the same kind of error with every secret of the session taken out of its line."""
        clean = scrub(str(exc), self.secrets)
        if clean == str(exc):
            return exc
        return type(exc)(clean)


def _budget(timeout: float | None, ends_at: float | None, settings: Settings) -> Budget:
    budget = Budget(NetLimits.from_settings(settings, read_s=timeout))
    if ends_at is not None:
        budget.ends_at = min(budget.ends_at, ends_at)
    return budget


def hub_session(endpoint: str | None, token: str | None, *, timeout: float | None = None,
                ends_at: float | None = None, settings: Settings = DEFAULTS) -> HubSession:
    """The Hub's session: huggingface_hub's auth headers (``token``, else HF_TOKEN / the saved login);
    the endpoint, limits and attempts from ``settings`` where the arguments do not say."""
    from huggingface_hub.utils import build_hf_headers

    endpoint = hub_endpoint(endpoint or settings.endpoint)
    headers = build_hf_headers(token=token)
    secrets = tuple(filter(None, [token, headers.get("authorization", "").removeprefix("Bearer "),
                                  *url_secrets(endpoint)]))
    return HubSession(endpoint, dict(headers), secrets, _budget(timeout, ends_at, settings),
                      attempts=settings.http_attempts, backoff_s=settings.http_backoff_s)


def server_session(url: str, settings: Settings = DEFAULTS) -> HubSession:
    """An inference server's session: no Hub headers; the command's deadline counts from now."""
    return HubSession(url.rstrip("/"), {"Content-Type": "application/json"}, url_secrets(url),
                      _budget(None, None, settings), hub=False, attempts=settings.http_attempts,
                      backoff_s=settings.http_backoff_s)




class ServerClient:
    """Requests to an inference server (the probe's ``--engine`` and ``--main-url``) from synchronous code,
    each through the bounded client (sources/net_edge.py runs it): each request within the command's
    deadline from its start (a probe run is as long as its prompts make it; no single request may take
    longer), all of them within one byte budget, a cap on each answer, JSON answers decoded by
    sources/net_json.py. Every error is one NetworkError line naming the server by its redacted URL
    (``what`` says which server it is)."""

    def __init__(self, url: str, what: str, settings: Settings = DEFAULTS) -> None:
        self.base = url.rstrip("/")
        self.shown = redact_url(self.base)
        self.what = what
        self.session = server_session(self.base, settings)

    def get(self, path: str, limit: int) -> bytes:
        return self._call("GET", path, None, limit)

    def get_json(self, path: str, limit: int, *, max_items: int | None = None) -> Any:
        return self._decode(path, self._call("GET", path, None, limit), max_items)

    def post_json(self, path: str, payload: Any, limit: int, *, max_items: int | None = None) -> Any:
        body = json.dumps(payload).encode()
        return self._decode(path, self._call("POST", path, body, limit), max_items)

    def _decode(self, path: str, body: bytes, max_items: int | None) -> Any:
        from ckptinspect.sources.net_json import MAX_ANSWER_VALUES, decode_answer

        return decode_answer(body, source=f"{self.shown}{path}", max_items=max_items or MAX_ANSWER_VALUES)

    def _call(self, method: str, path: str, content: bytes | None, limit: int) -> bytes:
        from ckptinspect.sources.net_edge import run_sync

        where = f"{self.shown}{path}"
        budget = self.session.budget
        budget.ends_at = time.monotonic() + budget.limits.deadline_s

        async def call() -> bytes:
            try:
                async with self.session.open(self.shown) as client:
                    status, _, body = await client.get_document(
                        self.base + path, path.lstrip("/"), {"Accept": "application/json"}, limit, method=method,
                        content=content, retry=method == "GET")
            except CkptInspectError as exc:
                raise self.session.scrubbed(exc) from None
            if status != 200:
                shown = scrub(body[:200].decode("utf-8", "replace"), self.session.secrets)
                raise NetworkError(f"the {self.what} answered HTTP {status}: {shown!r}", path=where)
            return body

        return run_sync(call)


__all__ = ["HubSession", "ServerClient", "hub_endpoint", "hub_session", "server_session", "url_secrets"]
