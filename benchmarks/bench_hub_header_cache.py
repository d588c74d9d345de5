"""A second ``report`` of the same commit with and without the Hub header cache (sources/header_cache.py),
against the project's test Hub server (tests/hub_server.py, in its own process) serving the full-scale
sparse replica of nvidia/Qwen3.5-397B-A17B-NVFP4 with a delay per request.

Per round, each run a ``ckptinspect report org/name --format json --quiet --verbose`` subprocess:

- first: fresh HF cache and fresh ckptinspect cache (what a first report costs);
- second: the same caches again (header cache on: the repo info only);
- second, cache off: the same warm HF cache with ``CKPTINSPECT_HEADER_CACHE=0`` (the second report before
  the header cache: JSON files from the HF cache, every header from the server).

The two second runs alternate order from round to round. Requests are the server's count (redirect hops
included), wall time is the subprocess's.

    python benchmarks/bench_hub_header_cache.py [--replica DIR] [--latency-ms 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hub_server_process import ServerProcess  # noqa: E402

REPO = "nvidia/Qwen3.5-397B-A17B-NVFP4"


def _run(server: ServerProcess, home: Path, *, cache: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    env.update(HF_ENDPOINT=server.url, HF_HOME=str(home / "hf"), PYTHONPATH=str(ROOT),
               CKPTINSPECT_CACHE_DIR=str(home / "ck"), CKPTINSPECT_HEADER_CACHE="1" if cache else "0")
    server.reset_stats()
    t0, cpu0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "report", REPO, "--format", "json", "--quiet",
                           "--verbose"], capture_output=True, text=True, env=env, timeout=600)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    doc = json.loads(proc.stdout)
    stats = doc["source"].pop("stats")
    got = server.stats()
    return {"wall": wall, "cpu": cpu, "requests": got["requests"], "bytes": got["bytes"], "doc": doc,
            "from_cache": stats.get("headers_from_cache"), "read_s": stats.get("wall_s"),
            "headers_s": stats.get("headers_s")}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path, help="an existing replica directory (else built in a temp dir)")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    replica = args.replica
    if replica is None:
        from fixtures.replica import build_replica

        t0 = time.perf_counter()
        replica = build_replica(Path(tempfile.mkdtemp(prefix="bench_hub_replica_")))
        print(f"built replica in {time.perf_counter() - t0:.1f} s: {replica}")
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs; latency {args.latency_ms:g} ms")
    rows: dict[str, list[dict]] = {"first": [], "second (header cache)": [], "second (cache off)": []}
    with ServerProcess({REPO: replica}, latency_ms=args.latency_ms, redirects=True) as server:
        for i in range(args.runs):
            home = Path(tempfile.mkdtemp(prefix="bench_hdr_cache_"))
            try:
                first = _run(server, home, cache=True)
                rows["first"].append(first)
                order = [True, False] if i % 2 == 0 else [False, True]
                for cache in order:
                    got = _run(server, home, cache=cache)
                    assert got["doc"] == first["doc"], "a second report differs from the first"
                    rows["second (header cache)" if cache else "second (cache off)"].append(got)
            finally:
                shutil.rmtree(home, ignore_errors=True)
    print(f"{'run':<24} {'report s (median)':>18} {'min':>6} {'CPU s':>6} {'Hub read s':>11} {'headers s':>10} "
          f"{'requests':>9} {'bytes':>12} {'headers cached':>15}")
    for name, got in rows.items():
        walls = [g["wall"] for g in got]
        med = statistics.median
        print(f"{name:<24} {med(walls):>18.2f} {min(walls):>6.2f} {med(g['cpu'] for g in got):>6.2f} {med(g['read_s'] for g in got):>11.2f} "
              f"{med(g['headers_s'] for g in got):>10.2f} {got[0]['requests']:>9} {got[0]['bytes']:>12,} "
              f"{got[0]['from_cache']!s:>15}")
    print("report s / CPU s: the subprocess (median); Hub read s: open_hub's wall_s (--verbose), headers s: its headers_s phase")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
