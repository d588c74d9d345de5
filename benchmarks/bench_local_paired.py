"""Local report on the 397B replica: this checkout against another one (e.g. the previous main), paired.

Each round runs ``python -m ckptinspect report DIR --format json --quiet`` once per checkout, in
alternating order, both with this interpreter and PYTHONPATH set to the checkout, and prints each
round's walls and CPU (user + system of the subprocess: what stays comparable on a busy machine), the
load average before it, the medians and their ratios; it also checks that both checkouts print the same
report.

    python benchmarks/bench_local_paired.py --replica DIR --base /path/to/other/checkout [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(checkout: Path, replica: Path) -> tuple[float, float, str]:
    """(wall, CPU, stdout) of one report."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckptinspect", "report", str(replica), "--format", "json",
                           "--quiet"], capture_output=True, text=True, env=env, cwd=str(checkout))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    tools = {"this checkout": ROOT, "base": args.base.resolve()}
    outputs = {name: _run(path, args.replica)[2] for name, path in tools.items()}  # warm-up
    same = outputs["this checkout"] == outputs["base"]
    walls: dict[str, list[float]] = {name: [] for name in tools}
    cpus: dict[str, list[float]] = {name: [] for name in tools}
    for round_no in range(args.runs):
        order = list(tools) if round_no % 2 == 0 else list(tools)[::-1]
        load = os.getloadavg()[0]
        took = {name: _run(tools[name], args.replica)[:2] for name in order}
        for name, (wall, cpu) in took.items():
            walls[name].append(wall)
            cpus[name].append(cpu)
        print(f"round {round_no + 1} (load {load:.1f}): "
              + ", ".join(f"{n} {w:.3f} s / {c:.3f} CPU-s" for n, (w, c) in took.items()))
    ours, base = statistics.median(walls["this checkout"]), statistics.median(walls["base"])
    ours_cpu, base_cpu = statistics.median(cpus["this checkout"]), statistics.median(cpus["base"])
    wins = sum(o <= b for o, b in zip(walls["this checkout"], walls["base"]))
    print(f"median: this checkout {ours:.3f} s / {ours_cpu:.3f} CPU-s, base {base:.3f} s / {base_cpu:.3f} CPU-s, "
          f"ratio {ours / base:.2f} (CPU {ours_cpu / base_cpu:.2f}); this checkout faster or equal in {wins} of "
          f"{args.runs} rounds; same report JSON: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
