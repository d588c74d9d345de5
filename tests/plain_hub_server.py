"""A second Hub-protocol server, written independently of hub_server.py and as plainly as the standard
library allows: ``http.server.ThreadingHTTPServer`` with its defaults (HTTP/1.0, so one connection per
request, and a listen backlog of 5), a fixed delay before every answer, no CDN redirects.

A speed result that holds on one server implementation only is a property of that server; benchmarks
(benchmarks/bench_hub_servers.py) run against both. Serves what ``HfApi.model_info`` /
``get_safetensors_metadata`` and ckptinspect ask for:

- ``GET /api/models/{org}/{name}[/revision/{rev}][?blobs=True]``: sha and siblings (size, blobId, lfs);
- ``GET|HEAD /{org}/{name}/resolve/{rev}/{file}``: the file, one ``Range: bytes=a-b`` -> 206.

``python tests/plain_hub_server.py [--latency-ms MS] ORG/NAME DIR`` prints the URL and serves until stdin
closes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def make_handler(repo_id: str, root: Path, latency_s: float) -> type[BaseHTTPRequestHandler]:
    sha = hashlib.sha1(repo_id.encode()).hexdigest()
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}

    def siblings(blobs: bool) -> list[dict]:
        out = []
        for rel, path in files.items():
            entry: dict = {"rfilename": rel}
            if blobs:
                size = path.stat().st_size
                entry.update(size=size, blobId=hashlib.sha1(rel.encode()).hexdigest())
                if rel.endswith(".safetensors"):
                    entry["lfs"] = {"sha256": hashlib.sha256(rel.encode()).hexdigest(), "size": size,
                                    "pointerSize": 134}
            out.append(entry)
        return out

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _reply(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _answer(self, head: bool) -> None:
            time.sleep(latency_s)
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            if path.startswith(f"/api/models/{repo_id}"):
                info = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "gated": False,
                        "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                        "siblings": siblings("blobs=true" in parts.query.lower())}
                return self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
            prefix = f"/{repo_id}/resolve/"
            if path.startswith(prefix):
                _, _, name = path[len(prefix):].partition("/")
                target = files.get(name)
                if target is not None:
                    return self._file(target, head)
            body = json.dumps({"error": "not found"}).encode()
            self._reply(404, body, {"Content-Type": "application/json", "X-Error-Code": "EntryNotFound"}, head)

        def _file(self, target: Path, head: bool) -> None:
            size = target.stat().st_size
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(str(target).encode()).hexdigest()}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            match = _RANGE.match(self.headers.get("Range", ""))
            start, end, status = 0, size - 1, 200
            if match:
                start = int(match.group(1))
                end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
                if start > end:
                    return self._reply(416, b"", {"Content-Range": f"bytes */{size}"}, head)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            with open(target, "rb") as fh:
                fh.seek(start)
                body = fh.read(end - start + 1)
            self._reply(status, body, headers, head)

    return Handler


class PlainHub:
    """The server in a thread of this process (``start`` / ``stop``), for tests."""

    def __init__(self, repo_id: str, root: Path, latency_s: float = 0.0) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(repo_id, Path(root), latency_s))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "PlainHub":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:  # pragma: no cover - used by benchmarks/bench_hub_servers.py
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("repo")
    ap.add_argument("directory")
    args = ap.parse_args()
    with PlainHub(args.repo, Path(args.directory), args.latency_ms / 1000) as server:
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":  # pragma: no cover
    main()
