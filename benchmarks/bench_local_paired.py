"""Local report on the 397B replica: this checkout against another one (e.g. the previous main), paired.

Each round runs ``python -m ckptinspect report DIR --format json --quiet`` once per checkout, in
alternating order, both with this interpreter and PYTHONPATH set to the checkout, and prints each
round's walls, the load average before it, the medians and their ratio; it also checks that both
checkouts print the same report.

    python benchmarks/bench_local_paired.py --replica DIR --base /path/to/other/checkout [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(checkout: Path, replica: Path) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckptinspect", "report", str(replica), "--format", "json",
                           "--quiet"], capture_output=True, text=True, env=env, cwd=str(checkout))
    return time.perf_counter() - start, done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    tools = {"this checkout": ROOT, "base": args.base.resolve()}
    outputs = {name: _run(path, args.replica)[1] for name, path in tools.items()}  # warm-up
    same = outputs["this checkout"] == outputs["base"]
    walls: dict[str, list[float]] = {name: [] for name in tools}
    for round_no in range(args.runs):
        order = list(tools) if round_no % 2 == 0 else list(tools)[::-1]
        load = os.getloadavg()[0]
        took = {name: _run(tools[name], args.replica)[0] for name in order}
        for name, wall in took.items():
            walls[name].append(wall)
        print(f"round {round_no + 1} (load {load:.1f}): " + ", ".join(f"{n} {w:.3f} s" for n, w in took.items()))
    ours, base = statistics.median(walls["this checkout"]), statistics.median(walls["base"])
    wins = sum(o <= b for o, b in zip(walls["this checkout"], walls["base"]))
    print(f"median: this checkout {ours:.3f} s, base {base:.3f} s, ratio {ours / base:.2f}; "
          f"this checkout faster or equal in {wins} of {args.runs} rounds; same report JSON: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
