"""The Hub reader's transport is huggingface_hub's own httpx client (sources/hub_client.py): proxies and
TLS trust from the environment exactly as huggingface_hub reads them (differential tests against its
client), no credentials sent to the CDN host a redirect points at, a dead proxy named as the cause.
Real sockets on 127.0.0.1, no internet."""

from __future__ import annotations

import asyncio
import http.client
import shutil
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import NetworkError  # noqa: E402
from ckptinspect.sources.hub_client import FetchStats, HubClient, make_client  # noqa: E402
from ckptinspect.sources.net_limits import Budget, NetLimits  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402

REPO = "org/tiny"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                "no_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture()
def served(tmp_path):
    root = tmp_path / "repo"
    headers = make_sharded_repo(root, shards=3, experts=8)
    with HubServer() as server:
        server.add_repo(REPO, root, gated_token="hf_secret")
        yield server, headers


class ForwardProxy:
    """A plain-HTTP forward proxy: absolute-form GETs are relayed to their origin and logged."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []  # (absolute URL, Proxy-Authorization)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy.seen.append((self.path, self.headers.get("Proxy-Authorization")))
                target = urlsplit(self.path)
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-authorization", "host")}
                upstream.request("GET", target.path + (f"?{target.query}" if target.query else ""), headers=headers)
                resp = upstream.getresponse()
                body = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                upstream.close()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_token_goes_to_the_hub_but_not_to_the_cdn_it_redirects_to(served):
    server, headers = served
    raw = open_hub(REPO, endpoint=server.url, token="hf_secret", progress=False)
    assert dict(raw.headers) == headers
    paths = server.authorized
    assert sum("/resolve/" in p and p.endswith(".safetensors") for p in paths) == len(headers)
    assert not [p for p in paths if p.startswith("/cdn/")]
    assert [e for e in server.stats()["log"] if e[1].startswith("/cdn/")]  # the CDN was asked, without it


def test_header_reads_go_through_the_http_proxy_from_the_environment(served, monkeypatch):
    server, headers = served
    proxy = ForwardProxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:pw@"))
        raw = open_hub(REPO, endpoint=server.url, token="hf_secret", progress=False)
    finally:
        proxy.close()
    assert dict(raw.headers) == headers
    shard_urls = [u for u, _ in proxy.seen if u.endswith(".safetensors")]
    assert len([u for u in shard_urls if "/resolve/" in u]) == len(headers)  # every header read, proxied
    assert len([u for u in shard_urls if "/cdn/" in u]) == len(headers)  # and every redirect hop
    assert {a for u, a in proxy.seen if u in shard_urls} == {"Basic dXNlcjpwdw=="}  # base64("user:pw")


def test_no_proxy_bypasses_the_proxy(served, monkeypatch):
    server, headers = served
    proxy = ForwardProxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        raw = open_hub(REPO, endpoint=server.url, token="hf_secret", progress=False)
    finally:
        proxy.close()
    assert dict(raw.headers) == headers
    assert proxy.seen == []


class RangeFileServer:
    """HTTP on 127.0.0.1 answering single ranges of one blob; HTTPS with ``certfile`` / ``keyfile`` (self-signed)."""

    def __init__(self, blob: bytes, certfile: Path | None = None, keyfile: Path | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                start, end = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
                body = blob[start:end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(blob)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if certfile is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certfile, keyfile)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        scheme = "https" if certfile is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}/blob"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def _ours(url: str, start: int, end: int) -> bytes:
    """One range read through the Hub reader's client (a fresh one, as each command makes)."""
    async def go() -> bytes:
        budget = Budget(NetLimits())
        async with make_client(budget) as client:
            hub = HubClient(client, REPO, {}, budget=budget, stats=FetchStats(), attempts=1)
            return await hub.get_range(url, "blob", start, end)
    return asyncio.run(go())


def _theirs(url: str, start: int, end: int) -> bytes:
    """The same read through huggingface_hub's shared client (rebuilt: it reads the environment once)."""
    from huggingface_hub import close_session, get_session

    close_session()
    try:
        resp = get_session().get(url, headers={"Range": f"bytes={start}-{end}"})
        resp.raise_for_status()
        return resp.content
    finally:
        close_session()


def _outcome(fn, url: str) -> str:
    try:
        fn(url, 100, 4195)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the class of failure is what is compared
        return "untrusted" if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "not trusted" in str(exc) else repr(exc)


@pytest.mark.parametrize("env", ["none", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_tls_trust_equals_huggingface_hubs(self_signed, monkeypatch, tmp_path, env):
    """Whatever the CA variables say, the reader trusts a certificate exactly when huggingface_hub does:
    SSL_CERT_FILE / SSL_CERT_DIR name extra trust, REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE are not read by
    huggingface_hub 2.x (httpx), so not here either."""
    cert, key = self_signed
    blob = bytes(range(256)) * 64
    for var in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    if env == "SSL_CERT_DIR":
        if shutil.which("openssl") is None:
            pytest.skip("needs openssl to hash a CA directory")
        cadir = tmp_path / "cadir"
        cadir.mkdir()
        digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(cert)], check=True,
                                capture_output=True, text=True).stdout.strip()
        shutil.copy(cert, cadir / f"{digest}.0")
        monkeypatch.setenv(env, str(cadir))
    elif env != "none":
        monkeypatch.setenv(env, str(cert))
    server = RangeFileServer(blob, cert, key)
    try:
        ours, theirs = _outcome(_ours, server.url), _outcome(_theirs, server.url)
    finally:
        server.close()
    assert ours == theirs
    assert ours == ("ok" if env in ("SSL_CERT_FILE", "SSL_CERT_DIR") else "untrusted")


def test_without_ca_variables_the_trust_store_is_huggingface_hubs(monkeypatch):
    """No CA variable set: the reader's TLS context holds the same CA certificates as huggingface_hub's
    client (the system store: httpx's default, truststore on Windows / macOS), not another bundle."""
    from huggingface_hub import close_session, get_session

    for var in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(var, raising=False)

    def cas(client) -> list:
        ctx = client._transport._pool._ssl_context
        return sorted(str(c) for c in ctx.get_ca_certs()) if hasattr(ctx, "get_ca_certs") else [type(ctx).__name__]

    close_session()
    try:
        theirs = cas(get_session())
    finally:
        close_session()
    client = make_client(Budget(NetLimits()))
    try:
        ours = cas(client)
    finally:
        asyncio.run(client.aclose())
    assert ours == theirs


def test_a_dead_proxy_is_named_as_the_cause_and_its_password_never_shown(served, monkeypatch):
    server, _ = served
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://proxyuser:s3cretpw@127.0.0.1:{port}")
    with pytest.raises(NetworkError) as err:
        open_hub(REPO, endpoint=server.url, token="hf_secret", progress=False)
    message = str(err.value)
    assert f"proxy http://127.0.0.1:{port}" in message and "\n" not in message
    assert "s3cretpw" not in message and "hf_secret" not in message
    # huggingface_hub goes through the same proxy: its own client fails to connect as well
    from huggingface_hub import close_session, get_session

    close_session()
    try:
        with pytest.raises(Exception) as theirs:
            get_session().get(f"{server.url}/api/models/{REPO}")
        assert "Connect" in type(theirs.value).__name__ or "Proxy" in type(theirs.value).__name__
    finally:
        close_session()


def test_reads_take_up_to_a_mebibyte_per_socket_read_and_keep_every_byte():
    """make_client raises httpcore's per-read size (hub_client.READ_BYTES); the locked httpcore must still
    have the attribute it reads, and a range larger than one read arrives byte for byte."""
    import hashlib

    from ckptinspect.sources import hub_client

    body = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(160_000))  # 5 MB
    server = RangeFileServer(body)
    try:
        assert _ours(server.url, 7, len(body) - 3) == body[7:len(body) - 2]
    finally:
        server.close()
    connection = hub_client.http11_connection(hub_client.httpx_module())
    assert connection is not None and connection.READ_NUM_BYTES == hub_client.READ_BYTES > 64 * 1024
