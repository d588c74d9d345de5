"""A Hub-protocol test server (hub_server.py) that misbehaves slowly, on 127.0.0.1.

Modes, each for requests whose path contains a substring, a number of times (``None``: always):

- ``drip``: the whole answer (status line, headers, body) goes out one byte every ``interval_s``
  seconds: every single socket read gets a byte well within any read timeout, yet the answer never
  ends in useful time.
- ``endless``: ``200`` with no Content-Length (the server ignores ``Range``) and JSON-looking bytes,
  1 MiB at a time, until the client hangs up.
- ``retry_after``: ``429`` with ``Retry-After: seconds``.
- ``link_loop``: a listing page (one repo) whose ``Link: rel="next"`` names the page itself.
- ``listing_ids``: a listing page naming the ids in ``HostileHub.listed_ids`` (paths, terminal control).

``python tests/hostile_hub_server.py [--drip SUB:INTERVAL:TIMES] [--endless SUB:TIMES]
[--retry-after SUB:SECONDS:TIMES] ORG/NAME DIR ...`` serves in its own process (so a client there can be
single-threaded and fork its index reader), prints its URL, and stops when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer, _Handler, _Listener  # noqa: E402
from hub_server_process import ServedProcess  # noqa: E402


@dataclass
class Misbehaviour:
    kind: str  # drip | endless | retry_after | link_loop | listing_ids
    path_contains: str
    value: float = 1.0  # drip: seconds per byte; retry_after: the Retry-After seconds
    times: int | None = None
    hits: int = 0


class _Drip:
    """A write-only file that sends one byte per interval."""

    def __init__(self, raw: Any, interval_s: float, sent: list[int]) -> None:
        self.raw, self.interval_s, self.sent = raw, interval_s, sent

    def write(self, data: bytes) -> int:
        for i in range(len(data)):
            self.raw.write(data[i:i + 1])
            self.raw.flush()
            self.sent[0] += 1
            time.sleep(self.interval_s)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()

    @property
    def closed(self) -> bool:  # asked by socketserver when the answer ends
        return self.raw.closed


class HostileHub(HubServer):
    """HubServer plus slow and endless answers; ``sent`` counts the bytes the misbehaving answers wrote."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.misbehaviours: list[Misbehaviour] = []
        self.sent = [0]
        self.listed_ids: list[str] = []
        self.pages_served = 0

    def add(self, kind: str, path_contains: str, value: float = 1.0, times: int | None = None) -> Misbehaviour:
        rule = Misbehaviour(kind, path_contains, value, times)
        self.misbehaviours.append(rule)
        return rule

    def take(self, path: str) -> Misbehaviour | None:
        with self._lock:
            for rule in self.misbehaviours:
                if rule.path_contains in path and (rule.times is None or rule.hits < rule.times):
                    rule.hits += 1
                    return rule
        return None

    def start(self) -> str:
        handler = type("Handler", (_HostileHandler,), {"hub": self})
        for attr in ("_httpd", "_cdn"):
            httpd = _Listener(("127.0.0.1", 0), handler)
            setattr(self, attr, httpd)
            threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self.url


class _HostileHandler(_Handler):
    hub: HostileHub

    def _route(self, method: str) -> None:
        rule = self.hub.take(self.path) if not self.path.startswith("/_test/") else None
        try:
            if rule is None:
                return super()._route(method)
            if rule.kind == "drip":
                self.wfile = _Drip(self.wfile, rule.value, self.hub.sent)
                return super()._route(method)
            if rule.kind == "retry_after":
                return self._send(429, b"slow down", {"Retry-After": f"{rule.value:g}"}, method)
            if rule.kind in ("link_loop", "listing_ids"):
                return self._listing(rule.kind, method)
            self._endless()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _listing(self, kind: str, method: str) -> None:
        with self.hub._lock:
            self.hub.pages_served += 1
        ids = ["org/looped"] if kind == "link_loop" else self.hub.listed_ids
        body = json.dumps([{"_id": "0" * 24, "id": i, "sha": "0" * 40} for i in ids]).encode()
        headers = {"Content-Type": "application/json"}
        if kind == "link_loop":
            headers["Link"] = f'<{self.hub.url}{self.path}>; rel="next"'
        self._send(200, body, headers, method)

    def _endless(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        # Starts like a safetensors file with a 20 MB header (under the 25 MB cap) and like a JSON
        # object, so neither a length check nor a JSON decoder stops the reader early.
        self.wfile.write(struct.pack("<Q", 20_000_000) + b'{"weight_map": {')
        piece = b" " * (1 << 20)
        while True:
            self.wfile.write(piece)
            with self.hub._lock:
                self.hub.sent[0] += len(piece)


class HostileProcess(ServedProcess):
    """The server in its own process (see the module docstring)."""

    def __init__(self, repos: dict[str, Path], *, drip: tuple[tuple[str, float, int], ...] = (),
                 endless: tuple[tuple[str, int], ...] = (), retry_after: tuple[tuple[str, float, int], ...] = ()) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve())]
        for sub, interval, times in drip:
            cmd += ["--drip", f"{sub}:{interval}:{times}"]
        for sub, times in endless:
            cmd += ["--endless", f"{sub}:{times}"]
        for sub, seconds, times in retry_after:
            cmd += ["--retry-after", f"{sub}:{seconds}:{times}"]
        for repo_id, directory in repos.items():
            cmd += [repo_id, str(directory)]
        super().__init__(cmd, "hostile Hub server")


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - run by HostileProcess
    ap = argparse.ArgumentParser()
    ap.add_argument("--drip", action="append", default=[])
    ap.add_argument("--endless", action="append", default=[])
    ap.add_argument("--retry-after", action="append", default=[])
    ap.add_argument("pairs", nargs="+")
    args = ap.parse_args(argv)
    server = HostileHub(redirect_lfs=True)

    def times(value: str) -> int | None:
        return None if value in ("", "0", "always") else int(value)

    for spec in args.drip:
        sub, interval, count = spec.rsplit(":", 2)
        server.add("drip", sub, float(interval), times(count))
    for spec in args.endless:
        sub, count = spec.rsplit(":", 1)
        server.add("endless", sub, times=times(count))
    for spec in args.retry_after:
        sub, seconds, count = spec.rsplit(":", 2)
        server.add("retry_after", sub, float(seconds), times(count))
    for repo_id, directory in zip(args.pairs[::2], args.pairs[1::2]):
        server.add_repo(repo_id, directory)
    print(server.start(), flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
