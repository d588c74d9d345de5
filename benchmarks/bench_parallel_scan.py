"""The scan worker (inventory/parallel.py) forced on (CKPTINSPECT_PARALLEL_SCAN=1, whatever the load), left
to decide (unset: used only when a CPU stayed free and the volume pays) and off (=0), paired and
alternating: the remote report
through a test Hub server (cold HF cache and header cache per run) or a local directory, wall and CPU-s
(the report process and its worker), the load average per round, and whether the two report JSONs are
byte-identical (less ``source.stats``, which holds timings).

    python benchmarks/bench_parallel_scan.py --replica DIR [--runs 3] [--server keepalive|plain|local]
        [--modes on,auto,off] [--wait-idle CPUS]

``--wait-idle 1.7`` starts each round only once /proc/stat shows that many CPUs idle over a second
(at most a minute's wait); every round prints the idle CPUs measured just before it.
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
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
from bench_hub_servers import REPO, _idle_cpus, _Served, _wait_idle  # noqa: E402


def _run(ref: str, url: str | None, parallel: str) -> tuple[float, float, str]:
    home = tempfile.mkdtemp(prefix="bench_hf_")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    env.update(HF_HOME=home, PYTHONPATH=str(ROOT), CKPTINSPECT_CACHE_DIR=str(Path(home) / "ckptinspect"))
    env.pop("CKPTINSPECT_PARALLEL_SCAN", None)
    if parallel:
        env["CKPTINSPECT_PARALLEL_SCAN"] = parallel
    if url:
        env["HF_ENDPOINT"] = url
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckptinspect", "report", ref, "--format", "json", "--quiet"],
                          capture_output=True, text=True, env=env, cwd=str(ROOT))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"report failed: {done.stderr[-500:]}")
    doc = json.loads(done.stdout)
    doc.get("source", {}).pop("stats", None)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), json.dumps(doc)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server", choices=("keepalive", "plain", "local"), default="keepalive")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--modes", default="on,off", help="comma-separated: on (=1), auto (unset), off (=0)")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="CPUS")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    switch = {"on": "1", "auto": "", "off": "0"}
    served = None
    ref, url = str(args.replica), None
    if args.server != "local":
        script = {"keepalive": "hub_server_process.py", "plain": "plain_hub_server.py"}[args.server]
        served = _Served([sys.executable, str(ROOT / "tests" / script), "--latency-ms", str(args.latency_ms),
                          REPO, str(args.replica)])
        ref, url = REPO, served.url
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    docs: set[str] = set()
    try:
        _run(ref, url, "0")  # warm the page cache and the server
        for round_no in range(args.runs):
            if args.wait_idle is not None:
                _wait_idle(args.wait_idle)
            load, idle = os.getloadavg()[0], _idle_cpus(0.5)
            order = modes if round_no % 2 == 0 else modes[::-1]
            parts = []
            for name in order:
                wall, cpu, doc = _run(ref, url, switch[name])
                times[name].append((wall, cpu))
                docs.add(doc)
                parts.append(f"{name} {wall:.2f} s / {cpu:.2f} CPU-s")
            print(f"{args.server} round {round_no + 1} (load {load:.1f}, idle {idle:.1f} CPUs before): "
                  + ", ".join(parts), flush=True)
    finally:
        if served is not None:
            served.close()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    parts = ", ".join(f"{m} {med[m][0]:.3f} s / {med[m][1]:.3f} CPU-s" for m in modes)
    ratios = "".join(f"; wall {m}/off {med[m][0] / med['off'][0]:.2f}" for m in modes if m != "off" and "off" in med)
    print(f"{args.server} medians: {parts}{ratios}; same report JSON: {len(docs) == 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
