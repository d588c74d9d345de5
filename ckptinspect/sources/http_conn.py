"""Keep-alive HTTP/1.1 connections for the header reads, one set per fetch thread (standard library only).

Why not huggingface_hub's httpx session: reading the 94 headers of a 230 GB checkpoint is bound by the
client's CPU (16 threads share one GIL), and httpx spends ~3.5x the CPU of ``http.client`` per ranged GET
(94 GETs, 52 MB, measured side by side: 0.20 vs 0.056 CPU-s; BENCHMARKS.md section 2). Everything that
makes it a *Hub* client still comes from huggingface_hub: endpoint, token and user-agent headers
(``build_hf_headers``), the commit a revision resolves to, the error mapping of the repo-info call, the
cache. What the session would have given for free is kept here: certificate checks against the same CA
bundle (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, else certifi, else the system store), ``HTTP(S)_PROXY`` /
``NO_PROXY`` (HTTPS through ``CONNECT``), and no ``Authorization`` header sent to another host after a
redirect (the Hub redirects weights to its CDN with a signed URL).
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import threading
import urllib.request
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import unquote, urljoin, urlsplit

REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class Origin:
    scheme: str  # http | https
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> "Origin":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        return cls(parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


def request_target(url: str) -> str:
    """Path and query of ``url`` as sent on the request line."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def redirect_target(url: str, location: str, headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The next URL and headers after a redirect: credentials never follow to another host."""
    target = urljoin(url, location)
    out = dict(headers)
    if Origin.of(target) != Origin.of(url):
        out = {k: v for k, v in out.items() if k.lower() != "authorization"}
    return target, out


@dataclass
class Route:
    """A connection and how requests go over it."""

    conn: http.client.HTTPConnection
    absolute: bool = False  # plain-HTTP proxy: absolute-form request target
    extra_headers: Mapping[str, str] = field(default_factory=dict)  # Proxy-Authorization for that proxy


class ConnectionPool:
    """One keep-alive connection per (thread, origin); a connection is never shared between threads."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []  # for close_all(), from any thread
        self._lock = threading.Lock()

    def get(self, origin: Origin) -> Route:
        routes = self._routes()
        route = routes.get(origin)
        if route is None:
            route = routes[origin] = _connect(origin, self.timeout)
            with self._lock:
                self._all.append(route.conn)
        return route

    def close_all(self) -> None:
        """Close every connection made, whichever thread made it (the fetch threads are gone by now)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()

    def discard(self, origin: Origin) -> None:
        """Close and forget this thread's connection (after an error or a body left unread)."""
        route = self._routes().pop(origin, None)
        if route is not None:
            route.conn.close()

    def _routes(self) -> dict[Origin, Route]:
        routes = getattr(self._local, "routes", None)
        if routes is None:
            routes = self._local.routes = {}
        return routes


def _connect(origin: Origin, timeout: float) -> Route:
    proxy = _proxy_for(origin)
    if proxy is None:
        if origin.scheme == "https":
            return Route(http.client.HTTPSConnection(origin.host, origin.port, timeout=timeout, context=tls_context()))
        return Route(http.client.HTTPConnection(origin.host, origin.port, timeout=timeout))
    # The proxy is spoken to in plain HTTP (the usual http://host:port value; TLS to the proxy itself
    # is not supported by http.client's tunnels).
    parts = urlsplit(proxy)
    auth: dict[str, str] = {}
    if parts.username is not None:
        token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
        auth = {"Proxy-Authorization": f"Basic {token}"}
    host, port = parts.hostname, parts.port or 80
    if origin.scheme == "https":  # CONNECT tunnel, then TLS end to end with the origin
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=tls_context())
        conn.set_tunnel(origin.host, origin.port, headers=auth)
        return Route(conn)
    return Route(http.client.HTTPConnection(host, port, timeout=timeout), absolute=True, extra_headers=auth)


def _proxy_for(origin: Origin) -> str | None:
    """HTTP(S)_PROXY / ALL_PROXY unless NO_PROXY names the host (urllib's reading of the environment)."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(origin.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(origin.host):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


_TLS: ssl.SSLContext | None = None
_TLS_LOCK = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """Verified TLS: SSL_CERT_FILE / SSL_CERT_DIR when set, else certifi's bundle (as httpx), else the system's."""
    global _TLS
    with _TLS_LOCK:
        if _TLS is None:
            cafile = None
            if not (os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR")):
                try:
                    import certifi

                    cafile = certifi.where()
                except ImportError:  # pragma: no cover - certifi comes with huggingface_hub's httpx
                    cafile = None
            _TLS = ssl.create_default_context(cafile=cafile)
        return _TLS
