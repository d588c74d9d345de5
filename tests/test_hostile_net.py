"""Hostile Hub servers on 127.0.0.1 (tests/hostile_hub_server.py): answers that drip one byte at a time,
bodies without end, long Retry-After. Every read ends by its deadline, every byte received is counted
and charged to the command's byte budget, and the failure is one line naming the repo."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT  # noqa: E402
from hostile_hub_server import HostileHub, HostileProcess  # noqa: E402
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402

from ckptinspect.errors import ConfigError, NetworkError  # noqa: E402
from ckptinspect.sources import hub_client  # noqa: E402
from ckptinspect.settings import Settings, SettingsError  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402

REPO = "org/hostile"
INDEX = "model.safetensors.index.json"
SHARD = "model-00002-of-00003.safetensors"


@pytest.fixture(autouse=True)
def _limits(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    monkeypatch.setattr(hub_client, "DEFAULT_ATTEMPTS", 2)
    monkeypatch.setattr(hub_client, "DEFAULT_BACKOFF_S", 0.01)


def _settings(**limits) -> Settings:
    """A command's settings with these limits (ckptinspect/settings.py), the attempts and backoff the
    fixture sets, and a socket-read timeout far longer than any drip interval here (it never fires)."""
    return Settings(**{"http_attempts": hub_client.DEFAULT_ATTEMPTS, "http_backoff_s": hub_client.DEFAULT_BACKOFF_S,
                       "read_timeout_s": 5.0, **limits})


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "repo"
    headers = make_sharded_repo(root, shards=3, experts=8)
    return root, headers


@pytest.fixture()
def hub(repo_dir):
    root, _ = repo_dir
    with HostileHub() as server:
        server.add_repo(REPO, root)
        yield server


def test_the_drip_defeats_a_per_read_timeout(hub):
    """The control: every socket read gets its byte within a 1 s timeout, and the answer is still not
    complete after 2 s more. A client with only socket timeouts would read on."""
    hub.add("drip", "/api/models/", 0.01)
    parts = urlsplit(hub.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=1.0)
    try:
        conn.request("GET", f"/api/models/{REPO}?blobs=True")
        resp = conn.getresponse()  # the status line and headers drip too
        start, got = time.monotonic(), 0
        while time.monotonic() - start < 2.0:
            assert resp.read(1)  # a byte within the timeout, every time
            got += 1
        assert got < int(resp.getheader("Content-Length"))
    finally:
        conn.close()


@pytest.mark.parametrize("where", ["/api/models/", INDEX, f"/cdn/{REPO}"])
def test_dripping_answer_ends_at_the_request_deadline(hub, monkeypatch, where):
    """Repo info, the index, the shards: each request gives up after CKPTINSPECT_REQUEST_TIMEOUT_S."""
    hub.add("drip", where, 0.02)
    started = time.monotonic()
    with pytest.raises(NetworkError) as err:
        open_hub(REPO, endpoint=hub.url, progress=False, settings=_settings(request_timeout_s=1))
    elapsed = time.monotonic() - started
    message = str(err.value)
    assert message.startswith(f"{REPO}")
    assert "no complete answer within 1 s" in message and "2 attempts" in message
    assert "\n" not in message
    assert elapsed < 60  # hang guard only (no speed claim): the message names the 1 s that ended each attempt


def test_whole_read_deadline_bounds_many_slow_requests(hub, monkeypatch):
    """Each shard request alone would be allowed 30 s; the read as a whole stops at its 2 s deadline."""
    hub.add("drip", f"/cdn/{REPO}", 0.05)
    started = time.monotonic()
    with pytest.raises(NetworkError, match="did not finish within its 2 s deadline") as err:
        open_hub(REPO, endpoint=hub.url, progress=False, settings=_settings(request_timeout_s=30, deadline_s=2))
    assert time.monotonic() - started < 60  # hang guard only: the message names the 2 s deadline that fired
    assert "--deadline" in str(err.value)


def test_long_retry_after_gives_up_at_once(hub):
    hub.add("retry_after", f"/cdn/{REPO}", 60)
    started = time.monotonic()
    with pytest.raises(NetworkError) as err:
        open_hub(REPO, endpoint=hub.url, progress=False)
    assert time.monotonic() - started < 45  # hang guard only: a wait would take 60 s; the message says why not
    assert "HTTP 429" in str(err.value) and "retrying after 60 s" in str(err.value)
    assert "CKPTINSPECT_RETRY_WAIT_S" in str(err.value)


def test_retry_waits_add_up_to_the_cap(hub, monkeypatch):
    """Short waits are honoured, but their sum per request stays under CKPTINSPECT_RETRY_WAIT_S."""
    settings = _settings(http_attempts=4, retry_wait_s=1.5)
    hub.add("retry_after", SHARD, 1, times=1)
    raw = open_hub(REPO, endpoint=hub.url, progress=False, settings=settings)  # one 1 s wait fits
    assert raw.stats["retries"] == 1
    hub.add("retry_after", SHARD, 1)
    started = time.monotonic()
    with pytest.raises(NetworkError, match="would pass the 1.5 s a request may spend waiting"):
        # the first read stored the header: without the header cache the shard is asked for again
        open_hub(REPO, endpoint=hub.url, progress=False, header_cache=False, settings=settings)
    assert time.monotonic() - started < 60  # hang guard only: the message names the cap that stopped the waits


def test_verbose_counts_every_body_byte_the_server_sent(hub, repo_dir):
    """Repo info, JSON files, redirects and header ranges: the client's count equals the server's."""
    _, headers = repo_dir
    hub.reset_stats()
    raw = open_hub(REPO, endpoint=hub.url, progress=False)
    served = hub.stats()
    assert dict(raw.headers) == headers
    assert raw.stats["bytes_fetched"] == served["bytes"] > 0
    assert raw.stats["requests"] == served["requests"]


def test_byte_budget_stops_an_endless_answer(hub, monkeypatch):
    """Repo info that never ends: read up to the command's byte budget, not up to the 64 MiB cap."""
    hub.add("endless", "/api/models/")
    started = time.monotonic()
    with pytest.raises(NetworkError, match="4,194,304 byte budget") as err:
        open_hub(REPO, endpoint=hub.url, progress=False, settings=_settings(max_bytes=4 << 20))
    assert str(err.value).startswith(f"{REPO}: cannot read the repo info: ")
    assert "CKPTINSPECT_MAX_BYTES" in str(err.value)
    assert time.monotonic() - started < 60  # hang guard only: the answer is endless; the budget ended it
    time.sleep(0.3)  # the server notices the closed connection
    assert hub.sent[0] < (4 << 20) + 16 * (1 << 20)  # the budget plus socket buffers left the server


# -- in a fresh interpreter, as the CLI runs ------------------------------------------------------------
def _env(url: str, home: Path, **extra: str) -> dict[str, str]:
    # A fresh process as a user starts it: only the basics of this environment, nothing that other tests
    # of this worker left in it (HF_*, CKPTINSPECT_*, proxies, timeouts) and no user-level site dirs.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")}
    env["PYTHONNOUSERSITE"] = "1"
    return {**env, "HF_ENDPOINT": url, "HF_HOME": str(home), "PYTHONPATH": str(ROOT),
            "CKPTINSPECT_CACHE_DIR": str(home / "ckptinspect-cache"), **extra}


def test_an_endless_index_answer_is_cut_at_its_declared_size(repo_dir, tmp_path):
    """A server that ignores Range and streams without end in place of the index: the reader stops at the
    size the repo info declared (a 200 is the whole file), so memory stays bounded and the answer is one
    line naming the file. The peak is the child's own VmHWM (reset at exec); getrusage's ru_maxrss is
    inherited across execve, so a child of a large pytest worker would report the worker's peak."""
    root, _ = repo_dir
    code = f"""
import json, re
from ckptinspect.errors import CkptInspectError
from ckptinspect.sources.hub import open_hub
try:
    open_hub("{REPO}", progress=False)
    err = None
except CkptInspectError as exc:
    err = str(exc)
hwm = re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)
print(json.dumps({{"err": err, "rss_kib": int(hwm)}}))
"""
    with HostileProcess({REPO: root}, endless=((INDEX, 1),)) as server:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env=_env(server.url, tmp_path / "h"))
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
    assert out["err"] is not None and out["err"].startswith(f"{REPO}/{INDEX}: ") and "\n" not in out["err"]
    assert out["rss_kib"] < 400 * 1024


def test_cli_deadline_flag_ends_a_dripping_index_read(repo_dir, tmp_path):
    """`ckptinspect --deadline 2 report` against a server dripping the index (the child's read and the
    parent's): exit 2, one stderr line, within the deadline plus start-up."""
    root, _ = repo_dir
    with HostileProcess({REPO: root}, drip=((INDEX, 0.05, 0),)) as server:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ckptinspect", "--deadline", "2", "report", REPO, "--quiet"],
                              capture_output=True, text=True, timeout=120, env=_env(server.url, tmp_path / "h"),
                              cwd=str(ROOT))
        elapsed = time.monotonic() - started
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert REPO in lines[0] and "2 s deadline" in lines[0]
    # hang guard only (no speed claim): the line names the 2 s deadline; the dripped index alone takes minutes
    assert elapsed < 60


def test_a_plain_http10_server_gives_the_same_headers_as_huggingface_hub(repo_dir):
    """The second server implementation (tests/plain_hub_server.py: HTTP/1.0, a connection per request,
    backlog 5): every header ckptinspect reads equals what huggingface_hub's own reader parses."""
    from huggingface_hub import HfApi

    from plain_hub_server import PlainHub

    root, headers = repo_dir
    with PlainHub(REPO, root, latency_s=0.005) as server:
        raw = open_hub(REPO, endpoint=server.url, progress=False)
        theirs = HfApi(endpoint=server.url).get_safetensors_metadata(REPO)
    assert dict(raw.headers) == headers
    small = [name for name in ("config.json", "hf_quant_config.json", INDEX, "generation_config.json")
             if (root / name).exists()]
    assert raw.stats["requests"] == 1 + len(small) + len(headers)  # repo info, JSON files, one range per shard
    for shard, header in raw.headers.items():
        ours = {k: v for k, v in json.loads(header).items() if k != "__metadata__"}
        meta = theirs.files_metadata[shard].tensors
        assert {k: (v["dtype"], v["shape"]) for k, v in ours.items()} == \
               {k: (t.dtype, t.shape) for k, t in meta.items()}


# -- what a hostile server says in its answers --------------------------------------------------------------
class _InfoServer:
    """Answers every repo-info request with the given JSON body, anything else with 404."""

    def __init__(self, body: bytes) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                ok = self.path.startswith("/api/models/")
                payload = body if ok else b"{}"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_repo_info_nested_deeper_than_the_json_limit_is_one_line():
    server = _InfoServer(b'{"siblings": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    try:
        with pytest.raises(ConfigError, match="nests deeper than") as err:
            open_hub(REPO, endpoint=server.url, progress=False)
    finally:
        server.close()
    assert REPO in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("info,needle", [
    ({"sha": "0" * 40, "siblings": [{"rfilename": "config.json", "size": "abc"}]}, "siblings[0].size"),
    ({"sha": "0" * 40, "siblings": [{"rfilename": "config.json", "size": -5}]}, "siblings[0].size"),
    ({"sha": "0" * 40, "siblings": [{"rfilename": 7}]}, "siblings[0]"),
    ({"sha": "0" * 40, "siblings": [{"rfilename": "model.safetensors", "size": 10, "lfs": [1]}]}, "siblings[0].lfs"),
    ({"sha": 12, "siblings": []}, "sha"),
    ({"sha": "0" * 40, "siblings": {"a": 1}}, "'siblings' list"),
    ([1, 2], "'siblings' list"),
])
def test_mistyped_repo_info_is_one_line(info, needle):
    server = _InfoServer(json.dumps(info).encode())
    try:
        with pytest.raises(NetworkError) as err:
            open_hub(REPO, endpoint=server.url, progress=False)
    finally:
        server.close()
    assert str(err.value).startswith(f"{REPO}: ") and needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("etag,revision", [("../../../../escaped", "main"), ("0" * 40 + "/../../x", "main"),
                                           ("a" * 40, "../../../escaped"), ("a" * 40, "/abs")])
def test_cache_store_never_writes_outside_the_cache_on_a_servers_word(tmp_path, etag, revision):
    """Blob names (etags) come from the server: only a sha1 / sha256 is used as a file name."""
    from ckptinspect.sources.hf_cache import cache_store, repo_storage

    cache_store(REPO, "b" * 40, revision, "config.json", b"{}", etag)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink())
    assert written == []
    cache_store(REPO, "b" * 40, "main", "config.json", b"{}", "c" * 64)  # a well-formed one is stored
    assert (repo_storage(REPO) / "snapshots" / ("b" * 40) / "config.json").read_bytes() == b"{}"


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/x", "javascript:alert(1)"])
def test_redirect_to_a_non_http_url_is_one_line(location):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with pytest.raises(NetworkError, match="not an http\\(s\\) URL") as err:
            open_hub(REPO, endpoint=f"http://127.0.0.1:{httpd.server_address[1]}", progress=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert str(err.value).startswith(f"{REPO}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("var,value", [("CKPTINSPECT_DEADLINE_S", "soon"), ("CKPTINSPECT_MAX_BYTES", "-1"),
                                       ("HF_HUB_DOWNLOAD_TIMEOUT", "0"), ("CKPTINSPECT_REQUEST_TIMEOUT_S", "nan")])
def test_a_bad_limit_setting_is_one_line_naming_the_variable(var, value):
    """Parsed once at the edge (ckptinspect/settings.py; the CLI's exit 2: tests/test_settings.py)."""
    with pytest.raises(SettingsError, match=var) as err:
        Settings.from_environ({var: value})
    assert "\n" not in str(err.value)
