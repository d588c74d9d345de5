"""load_rules with and without the JSON mirror of the built-in rule files, paired (ckptinspect/rules/mirror.py).

Each round starts one fresh interpreter per mode (alternating which goes first), which imports the
loader, then times ``load_rules()`` plus the two quantization-procedure files a report reads
(``time.process_time``: CPU of the first load, what a report pays). "without" makes the mirror answer
nothing, so every built-in file is parsed from its YAML. Prints each round, the medians and their ratio.

    python benchmarks/bench_rules_mirror.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time
from ckptinspect.rules import mirror
if sys.argv[1] == "without":
    mirror._entries = lambda root: {}
from ckptinspect.readiness import load_rules
from ckptinspect.readiness.module_quant import module_quant_rules
start = time.process_time()
load_rules()
module_quant_rules("sglang"), module_quant_rules("vllm")
print(time.process_time() - start)
"""


def _run(mode: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), check=True)
    return float(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    took: dict[str, list[float]] = {"with": [], "without": []}
    for round_no in range(args.runs):
        order = ["with", "without"] if round_no % 2 == 0 else ["without", "with"]
        load = os.getloadavg()[0]
        this = {mode: _run(mode) for mode in order}
        for mode, cpu in this.items():
            took[mode].append(cpu)
        print(f"round {round_no + 1} (load {load:.1f}): " + ", ".join(f"{m} {c * 1000:.1f} ms" for m, c in this.items()))
    with_, without = statistics.median(took["with"]), statistics.median(took["without"])
    print(f"median CPU of load_rules + the quantization files: with the mirror {with_ * 1000:.1f} ms, "
          f"without {without * 1000:.1f} ms, ratio {with_ / without:.2f}, saved {(without - with_) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
