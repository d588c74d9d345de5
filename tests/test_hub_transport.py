"""The header reads' own HTTP transport (sources/http_conn.py): proxies from the environment, and no
credentials sent to the CDN host a redirect points at. Real sockets on 127.0.0.1, no internet."""

from __future__ import annotations

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
from ckptinspect.sources import http_conn  # noqa: E402
from ckptinspect.sources.http_conn import redirect_target  # noqa: E402
from ckptinspect.sources.http_ranges import FetchStats, RangeClient  # noqa: E402
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


def test_redirect_keeps_credentials_on_the_same_origin_only():
    auth = {"authorization": "Bearer t", "Range": "bytes=0-9"}
    same, kept = redirect_target("https://hub.example/a/resolve/x", "/b", auth)
    other, dropped = redirect_target("https://hub.example/a/resolve/x", "https://cdn.example/b?sig=1", auth)
    assert (same, kept) == ("https://hub.example/b", auth)
    assert other == "https://cdn.example/b?sig=1" and dropped == {"Range": "bytes=0-9"}


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
    """HTTPS on 127.0.0.1 with a self-signed certificate, answering single ranges of one blob."""

    def __init__(self, blob: bytes, certfile: Path, keyfile: Path) -> None:
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
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certfile, keyfile)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}/blob"

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


def test_https_reads_verify_the_certificate(self_signed, monkeypatch):
    cert, key = self_signed
    blob = bytes(range(256)) * 64
    server = RangeFileServer(blob, cert, key)
    try:
        def client() -> RangeClient:
            monkeypatch.setattr(http_conn, "_TLS", None)  # the context is built once per process
            return RangeClient(REPO, {}, timeout=5, stats=FetchStats(), attempts=1)

        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        with pytest.raises(NetworkError, match="connection error: SSLCertVerificationError"):
            client().get(server.url, "blob", 0, 99)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusting it makes the same read work
        assert client().get(server.url, "blob", 100, 4195) == blob[100:4196]
    finally:
        server.close()
