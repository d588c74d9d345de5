"""A real HTTP server on 127.0.0.1 that speaks the slice of the Hugging Face Hub protocol that
huggingface_hub and ckptinspect use, serving fixture repos from directories on disk.

Endpoints (what huggingface_hub's ``HfApi`` / ``hf_hub_download`` / ``get_safetensors_metadata`` call):

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (``?blobs=true`` adds sizes, blob ids
  and LFS info per sibling), ``GET /api/models/{repo}/tree/{rev}[/{path}]``;
- ``HEAD|GET /{repo}/resolve/{rev}/{file}``: ETag, X-Repo-Commit, Content-Length; LFS files (``*.safetensors``
  and anything over 10 MB, like on the Hub) answer ``302`` to ``/cdn/...`` on a second port of the same
  server (another origin, like the Hub's CDN host) with X-Linked-Etag / X-Linked-Size;
- a single ``Range: bytes=a-b`` -> ``206`` + ``Content-Range`` (inclusive ranges, clamped to the file);
- gated repos answer ``401`` (no token) / ``403`` (wrong token) with ``X-Error-Code: GatedRepo``; missing repo,
  revision and file answer ``404`` with ``X-Error-Code`` RepoNotFound / RevisionNotFound / EntryNotFound.

Test controls: ``latency_s`` (added before every response), ``faults`` (see :class:`Fault`), and counters of
requests and body bytes sent (``stats()``), so tests can check "headers only".

LFS object ids are stand-ins (sha256 of path, size and the safetensors header), not content hashes:
hashing 94 sparse multi-GB shards would take minutes and nothing in ckptinspect verifies blob hashes; the
header is in, so an oid changes whenever what ckptinspect reads (and caches by etag) changes.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import hub_listing

LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub stores files over 10 MB in LFS
CHUNK = 256 * 1024
FAULT_KINDS = ("timeout", "5xx", "429", "reset", "truncate", "wrong-range", "ignore-range", "short")


@dataclass
class Fault:
    """Misbehave on matching requests, ``times`` times (``None`` = always).

    kind: ``timeout`` (sleep ``delay_s`` before answering), ``5xx`` (503), ``429`` (Retry-After: 0),
    ``reset`` (TCP RST, no answer), ``truncate`` (full Content-Length, half the body, then close),
    ``wrong-range`` (206 whose Content-Range starts 8 bytes later than asked), ``ignore-range`` (200 and
    stream the whole file), ``short`` (valid 206 with at most ``short_bytes`` bytes).
    """

    kind: str
    path_contains: str = ".safetensors"
    method: str = "GET"
    times: int | None = None
    delay_s: float = 3.0
    short_bytes: int = 1000
    hits: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")


@dataclass
class _Repo:
    repo_id: str
    revisions: dict[str, Path]  # branch/tag name -> directory
    commits: dict[str, str]  # name -> fake 40-hex commit sha
    gated_token: str | None = None
    tags: tuple[str, ...] = ()  # the Hub's tags, e.g. base_model:quantized:ORG/NAME (listing: hub_listing.py)
    files_cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _leading_bytes(path: Path) -> bytes:
    """A safetensors file's length prefix and header (else its first 1 MiB): what the stand-in LFS oid
    hashes, so an oid changes whenever a header does (a client may cache headers by commit and etag)."""
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        return head + f.read(n if 0 < n <= 100_000_000 else 1 << 20)


def _is_lfs(rel: str, size: int) -> bool:
    return rel.endswith(".safetensors") or size > LFS_THRESHOLD


class _Listener(ThreadingHTTPServer):
    # Class attributes: the listen backlog is set when the constructor binds, so assigning it on the
    # instance afterwards does nothing (and the default of 5 drops the SYNs of 32 parallel connects,
    # which then stall for the kernel's 1 s retransmit).
    request_queue_size = 256
    daemon_threads = True


class HubServer:
    """Threaded Hub-protocol server on an ephemeral port. Use as a context manager or start()/stop()."""

    def __init__(self, *, latency_s: float = 0.0, redirect_lfs: bool = True) -> None:
        self.latency_s = latency_s
        self.redirect_lfs = redirect_lfs
        self.faults: list[Fault] = []
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        self._log: list[tuple[str, str, str | None, int, int]] = []
        self._in_flight = 0
        self._answering = 0  # requests whose response headers have not gone out (peak_in_flight)
        self.peak_in_flight = 0  # the most requests being answered at once (both listeners)
        self.listing_page_size = 1000  # entries per /api/models page (the Hub's 1000); tests lower it
        self.authorized: list[str] = []  # paths of requests that carried an Authorization header
        self._httpd: ThreadingHTTPServer | None = None
        self._cdn: ThreadingHTTPServer | None = None

    # -- setup ----------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, directory: Path | str, *, revisions: dict[str, Path | str] | None = None,
                 gated_token: str | None = None, tags: tuple[str, ...] = ()) -> None:
        """Serve ``directory`` as ``repo_id`` at ``main`` (plus optional named revisions); ``tags`` are what
        the listing (``GET /api/models?filter=``) matches."""
        revs = {"main": Path(directory)}
        for name, path in (revisions or {}).items():
            revs[name] = Path(path)
        commits = {name: hashlib.sha1(f"{repo_id}@{name}".encode()).hexdigest() for name in revs}
        self._repos[repo_id] = _Repo(repo_id, revs, commits, gated_token, tuple(tags))

    def add_fault(self, kind: str, **kwargs: Any) -> Fault:
        fault = Fault(kind, **kwargs)
        self.faults.append(fault)
        return fault

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        assert self._cdn is not None, "server not started"
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def start(self) -> str:
        """Start the Hub listener and a second one on another port acting as the CDN (another origin,
        like the Hub's redirects to its CDN host, so huggingface_hub reads HEAD metadata off the 302)."""
        handler = type("Handler", (_Handler,), {"hub": self})
        for attr in ("_httpd", "_cdn"):
            httpd = _Listener(("127.0.0.1", 0), handler)
            setattr(self, attr, httpd)
            threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self.url

    def stop(self) -> None:
        for attr in ("_httpd", "_cdn"):
            httpd = getattr(self, attr)
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
                setattr(self, attr, None)

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- counters -------------------------------------------------------------------------------
    def reset_stats(self, settle_s: float = 2.0) -> None:
        """Forget the log, after the requests still being answered have logged (see stats)."""
        self._settle(settle_s)
        with self._lock:
            self._log.clear()

    def _settle(self, settle_s: float) -> None:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._in_flight == 0:
                    return
            time.sleep(0.01)

    def stats(self, settle_s: float = 2.0) -> dict[str, Any]:
        """requests (every HTTP request received, redirects and HEADs included), body bytes sent.

        Waits up to ``settle_s`` for requests still being answered: a client can have all its bytes
        before the handler thread logs them.
        """
        self._settle(settle_s)
        with self._lock:
            log = list(self._log)
        return {
            "requests": len(log),
            "bytes": sum(entry[4] for entry in log),
            "by_method": {m: sum(1 for e in log if e[0] == m) for m in sorted({e[0] for e in log})},
            "log": log,
        }

    def _record(self, method: str, path: str, rng: str | None, status: int, nbytes: int) -> None:
        with self._lock:
            self._log.append((method, path, rng, status, nbytes))

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.method != method or fault.path_contains not in path:
                    continue
                if fault.times is not None and fault.hits >= fault.times:
                    continue
                fault.hits += 1
                return fault
        return None

    # -- repo model -----------------------------------------------------------------------------
    def _resolve(self, repo_id: str, rev: str) -> tuple[_Repo, str, Path] | str:
        repo = self._repos.get(repo_id)
        if repo is None:
            return "RepoNotFound"
        for name, sha in repo.commits.items():
            if rev in (name, sha):
                return repo, sha, repo.revisions[name]
        return "RevisionNotFound"

    def _files(self, repo: _Repo, sha: str, root: Path) -> list[dict[str, Any]]:
        if sha not in repo.files_cache:
            entries = []
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                rel = path.relative_to(root).as_posix()
                size = path.stat().st_size
                entry: dict[str, Any] = {"path": rel, "size": size}
                if _is_lfs(rel, size):
                    oid = hashlib.sha256(f"{rel}:{size}:".encode() + _leading_bytes(path)).hexdigest()
                    entry["lfs"] = {"oid": oid, "size": size, "pointerSize": 134}
                    entry["oid"] = hashlib.sha1(f"pointer:{oid}".encode()).hexdigest()
                else:
                    entry["oid"] = _git_blob_sha1(path)
                entries.append(entry)
            repo.files_cache[sha] = entries
        return repo.files_cache[sha]


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive
    _still_answering = False  # set per request in _dispatch (send_error may answer before it)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
        pass

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    # -- plumbing -------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              method: str = "GET") -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = 0
        if method != "HEAD" and body:
            self.wfile.write(body)
            sent = len(body)
        self.hub._record(method, self.path, self.headers.get("Range"), status, sent)

    def _error(self, status: int, code: str, message: str, method: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                  "X-Error-Message": message}, method)

    def _json(self, payload: Any, method: str, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})},
                   method)

    def _dispatch(self, method: str) -> None:
        with self.hub._lock:
            self.hub._in_flight += 1
            self.hub._answering += 1
            self.hub.peak_in_flight = max(self.hub.peak_in_flight, self.hub._answering)
            if self.headers.get("Authorization"):
                self.hub.authorized.append(self.path)
        self._still_answering = True
        try:
            self._route(method)
        finally:
            self._answered()
            with self.hub._lock:
                self.hub._in_flight -= 1

    def _answered(self) -> None:
        """This request stops counting towards ``peak_in_flight``. Called as its response headers go out:
        the client cannot have its whole answer (and free its request slot) before that, so the peak
        never counts a request the client already let go of (after the write, this thread can lag
        behind the client's next request). ``_in_flight`` (what ``stats`` settles on) ends later."""
        if self._still_answering:
            self._still_answering = False
            with self.hub._lock:
                self.hub._answering -= 1

    def end_headers(self) -> None:
        self._answered()
        super().end_headers()

    def _route(self, method: str) -> None:
        if self.hub.latency_s:
            time.sleep(self.hub.latency_s)
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query)
        try:
            if path.startswith("/_test/"):  # control endpoints for a server in another process; not counted
                return self._control(path, method)
            if path == "/api/agent-harnesses":  # huggingface_hub 2.x user-agent registry, cached a day
                self._json({"standardEnvVars": [], "harnesses": {}}, method)
            elif path == "/api/models":  # the listing (tests/hub_listing.py)
                hub_listing.list_models(self, query, method)
            elif path.startswith("/api/models/"):
                self._api(path[len("/api/models/"):], query, method)
            elif path.startswith("/cdn/"):
                self._cdn(path[len("/cdn/"):], method)
            elif "/resolve/" in path:
                self._resolve_file(path, method)
            else:
                self._error(404, "NotFound", f"no route {path}", method)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _control(self, path: str, method: str) -> None:
        if path == "/_test/reset":
            self.hub.reset_stats(settle_s=0)  # this request itself is in flight
            self.hub.peak_in_flight = 0
            payload: Any = {"ok": True}
        else:
            # in_flight includes this request: settle on the others only
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                with self.hub._lock:
                    if self.hub._in_flight <= 1:
                        break
                time.sleep(0.01)
            with self.hub._lock:
                log = list(self.hub._log)
            payload = {"requests": len(log), "bytes": sum(e[4] for e in log), "log": log,
                       "peak_in_flight": self.hub.peak_in_flight}
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def _api(self, rest: str, query: dict[str, list[str]], method: str) -> None:
        segs = rest.split("/")
        repo_id, tail = "/".join(segs[:2]), segs[2:]
        rev, tree_path, is_tree = "main", "", False
        if tail[:1] == ["revision"] and len(tail) >= 2:
            rev = "/".join(tail[1:])
        elif tail[:1] == ["tree"] and len(tail) >= 2:
            rev, tree_path, is_tree = tail[1], "/".join(tail[2:]), True
        fault = self.hub._take_fault(method, self.path)
        if fault is not None and fault.kind in ("5xx", "429"):
            status = 503 if fault.kind == "5xx" else 429
            return self._send(status, b"injected", {"Retry-After": "0"}, method)
        resolved = self.hub._resolve(repo_id, rev)
        if isinstance(resolved, str):
            return self._error(404, resolved, f"{resolved}: {repo_id}@{rev}", method)
        repo, sha, root = resolved
        files = self.hub._files(repo, sha, root)
        if is_tree:
            prefix = f"{tree_path}/" if tree_path else ""
            out = [{"type": "file", **f} for f in files if f["path"].startswith(prefix)]
            return self._json(out, method)
        if hub_listing.bad_expand(query):  # the tree's `expand` is a flag; the repo info's, property names
            return self._error(400, "BadRequest", hub_listing.bad_expand(query) or "", method)
        blobs = query.get("blobs") == ["true"] or query.get("blobs") == ["True"]
        siblings = []
        for f in files:
            sib: dict[str, Any] = {"rfilename": f["path"]}
            if blobs:
                sib.update(size=f["size"], blobId=f["oid"])
                if "lfs" in f:
                    sib["lfs"] = {"sha256": f["lfs"]["oid"], "size": f["size"], "pointerSize": 134}
            siblings.append(sib)
        info = {"_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                "gated": "manual" if repo.gated_token else False, "disabled": False, "downloads": 0,
                "likes": 0, "tags": list(repo.tags), "siblings": siblings, "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z", "author": repo_id.split("/")[0]}
        self._json(hub_listing.expanded(info, query), method)

    def _resolve_file(self, path: str, method: str) -> None:
        head, _, tail = path.lstrip("/").partition("/resolve/")
        repo_id = head
        rev, _, filename = tail.partition("/")
        resolved = self.hub._resolve(repo_id, rev)
        if isinstance(resolved, str):
            return self._error(404, resolved, f"{resolved}: {repo_id}@{rev}", method)
        repo, sha, root = resolved
        if repo.gated_token:
            auth = self.headers.get("Authorization", "")
            if not auth:
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted.", method)
            if auth != f"Bearer {repo.gated_token}":
                return self._error(403, "GatedRepo", f"Access to model {repo_id} is not granted.", method)
        entry = next((f for f in self.hub._files(repo, sha, root) if f["path"] == filename), None)
        if entry is None:
            return self._error(404, "EntryNotFound", f"{filename} not found in {repo_id}@{rev}", method)
        common = {"X-Repo-Commit": sha, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        if "lfs" in entry:
            common.update({"X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Size": str(entry["size"])})
            if self.hub.redirect_lfs:
                location = f"{self.hub.cdn_url}/cdn/{quote(repo_id)}/{sha}/{quote(filename)}"
                return self._send(302, b"", {**common, "Location": location}, method)
        self._serve_bytes(root / filename, method, common)

    def _cdn(self, rest: str, method: str) -> None:
        segs = rest.split("/")
        repo_id, sha, filename = "/".join(segs[:2]), segs[2], "/".join(segs[3:])
        resolved = self.hub._resolve(repo_id, sha)
        if isinstance(resolved, str):
            return self._error(404, resolved, resolved, method)
        _, _, root = resolved
        target = root / filename
        if not target.is_file():
            return self._error(404, "EntryNotFound", filename, method)
        entry = next(f for f in self.hub._files(resolved[0], sha, root) if f["path"] == filename)
        self._serve_bytes(target, method, {"ETag": f'"{entry["lfs"]["oid"]}"', "Accept-Ranges": "bytes"})

    # -- byte serving with faults ---------------------------------------------------------------
    def _serve_bytes(self, target: Path, method: str, headers: dict[str, str]) -> None:
        size = target.stat().st_size
        rng = self.headers.get("Range")
        fault = self.hub._take_fault(method, self.path)
        if fault is not None:
            if fault.kind == "timeout":
                time.sleep(fault.delay_s)
            elif fault.kind == "5xx":
                return self._error(503, "ServiceUnavailable", "injected 503", method)
            elif fault.kind == "429":
                return self._send(429, b"slow down", {"Retry-After": "0"}, method)
            elif fault.kind == "reset":
                self.hub._record(method, self.path, rng, 0, 0)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
        start, end = 0, size - 1
        status = 200
        if rng and not (fault and fault.kind == "ignore-range"):
            try:
                unit, _, spec = rng.partition("=")
                a, _, b = spec.partition("-")
                if unit.strip() != "bytes" or "," in spec:
                    raise ValueError(rng)
                start, end = int(a), min(int(b) if b else size - 1, size - 1)
            except ValueError:
                return self._error(400, "BadRange", f"unsupported range {rng}", method)
            if start >= size or start > end:
                return self._send(416, b"", {"Content-Range": f"bytes */{size}", **headers}, method)
            status = 206
            if fault and fault.kind == "short":
                end = min(end, start + fault.short_bytes - 1)
        length = end - start + 1
        out = dict(headers)
        if status == 206:
            shown = start + 8 if (fault and fault.kind == "wrong-range") else start
            out["Content-Range"] = f"bytes {shown}-{shown + length - 1}/{size}"
        self.send_response(status)
        for key, value in out.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if method == "HEAD":
            return self.hub._record(method, self.path, rng, status, 0)
        limit = length // 2 if (fault and fault.kind == "truncate") else length
        sent = 0
        try:
            with open(target, "rb") as fh:
                fh.seek(start)
                while sent < limit:
                    chunk = fh.read(min(CHUNK, limit - sent))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.hub._record(method, self.path, rng, status, sent)
        if sent < length:
            self.close_connection = True


# -- test isolation ----------------------------------------------------------------------------------
