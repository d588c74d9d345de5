"""The test Hub server (hub_server.py) in its own process: its threads then share neither the client's
GIL nor its thread count. ``python tests/hub_server_process.py [--latency-ms MS] [--redirects] ORG/NAME DIR ...``
prints the endpoint URL on one line and serves until stdin closes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from hub_server import HubServer


class ServedProcess:
    """A test Hub server run as ``cmd`` in its own process: it prints its URL on one line, serves until its
    stdin closes, and answers /_test/stats (this server and tests/hostile_hub_server.py's)."""

    def __init__(self, cmd: list[str], what: str) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError(f"{what} did not start")

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.loads(resp.read())

    def stats(self) -> dict:
        return self._get("/_test/stats")

    def __enter__(self) -> "ServedProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ServerProcess(ServedProcess):
    """The server in its own process (``main`` below), for clients that must stay single-threaded (the Hub
    reader forks its index reader only then) or must not share a GIL with it (benchmarks)."""

    def __init__(self, repos: dict[str, Path], *, latency_ms: float = 0.0, redirects: bool = False,
                 faults: tuple[tuple[str, str, int], ...] = (), tags: dict[str, tuple[str, ...]] | None = None) -> None:
        """``faults``: (kind, path substring, times) for hub_server.Fault; ``tags``: repo -> its Hub tags."""
        cmd = [sys.executable, str(Path(__file__).resolve()), "--latency-ms", str(latency_ms)]
        cmd += ["--redirects"] if redirects else []
        for kind, where, times in faults:
            cmd += ["--fault", f"{kind}:{where}:{times}"]
        for repo_id, repo_tags in (tags or {}).items():
            cmd += [arg for tag in repo_tags for arg in ("--tag", f"{repo_id}={tag}")]
        for repo_id, directory in repos.items():
            cmd += [repo_id, str(directory)]
        super().__init__(cmd, "test Hub server")

    def reset_stats(self) -> None:
        self._get("/_test/reset")


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - used by benchmarks/bench_hub.py
    """python tests/hub_server_process.py [--latency-ms MS] [--redirects] [--fault KIND:SUBSTRING:TIMES ...]
    ORG/NAME DIR [ORG/NAME DIR ...]

    Prints the endpoint URL on one line, then serves until stdin closes or SIGTERM.
    """
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--redirects", action="store_true")
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--tag", action="append", default=[], help="ORG/NAME=TAG: a Hub tag of that repo")
    ap.add_argument("pairs", nargs="+")
    args = ap.parse_args(argv)
    server = HubServer(latency_s=args.latency_ms / 1000, redirect_lfs=args.redirects)
    for spec in args.fault:
        kind, where, times = spec.split(":")
        server.add_fault(kind, path_contains=where, times=int(times), delay_s=2.0)
    tags: dict[str, list[str]] = {}
    for spec in args.tag:
        repo_id, _, tag = spec.partition("=")
        tags.setdefault(repo_id, []).append(tag)
    for repo_id, directory in zip(args.pairs[::2], args.pairs[1::2]):
        server.add_repo(repo_id, directory, tags=tuple(tags.get(repo_id, ())))
    print(server.start(), flush=True)
    try:
        sys.stdin.read()  # the parent closes our stdin (or exits) to stop us
    finally:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
