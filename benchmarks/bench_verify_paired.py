"""`verify` on the full-scale 397B replica: this checkout against another one (e.g. the previous integ), paired.

Each round runs ``python -m ckptinspect verify DIR --engine ENGINE --engine-python PY --format json --quiet``
once per checkout, in alternating order, with this interpreter and PYTHONPATH set to the checkout, and
prints each round's wall and CPU seconds (ckptinspect and the engine's process together), the load average
before it, the medians and their ratio. It also checks that both checkouts answer the same VerifyResult
(every field but the timings) in every run: the differential the speed-ups must keep.

    python -m fixtures.replica /tmp/rep       # the 94-shard nvidia/Qwen3.5-397B-A17B-NVFP4 replica
    python benchmarks/bench_verify_paired.py --replica /tmp/rep/Qwen3.5-397B-A17B-NVFP4 \\
        --base /path/to/other/checkout --engine-python <vllm env>/bin/python [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _untimed(text: str) -> dict:
    """The VerifyResult JSON without its timings (the subprocess's wall, each step's seconds)."""
    doc = json.loads(text)
    doc.pop("seconds", None)
    for step in doc.get("steps", ()):
        step.pop("seconds", None)
    return doc


def _run(checkout: Path, args: argparse.Namespace) -> tuple[float, float, dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-m", "ckptinspect", "verify", str(args.replica), "--engine", args.engine,
               "--engine-python", args.engine_python, "--format", "json", "--quiet", "--deadline", "600"]
    if args.engine_pythonpath:
        command += ["--engine-pythonpath", args.engine_pythonpath]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(checkout))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return wall, cpu, _untimed(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path, required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    ap.add_argument("--engine-python", required=True)
    ap.add_argument("--engine-pythonpath", default=None)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tools = {"this checkout": ROOT, "base": args.base.resolve()}
    walls: dict[str, list[float]] = {name: [] for name in tools}
    cpus: dict[str, list[float]] = {name: [] for name in tools}
    answers: dict[str, list[dict]] = {name: [] for name in tools}
    for round_no in range(args.runs):
        order = list(tools) if round_no % 2 == 0 else list(tools)[::-1]
        load = os.getloadavg()[0]
        line = []
        for name in order:
            wall, cpu, answer = _run(tools[name], args)
            walls[name].append(wall)
            cpus[name].append(cpu)
            answers[name].append(answer)
            line.append(f"{name} {wall:.1f} s wall / {cpu:.1f} CPU-s")
        print(f"round {round_no + 1} (load {load:.1f}): " + ", ".join(line), flush=True)
    same = all(a == answers["base"][0] for name in tools for a in answers[name])
    ours, base = statistics.median(walls["this checkout"]), statistics.median(walls["base"])
    ours_cpu, base_cpu = statistics.median(cpus["this checkout"]), statistics.median(cpus["base"])
    first = answers["base"][0]
    print(f"median: this checkout {ours:.1f} s / {ours_cpu:.1f} CPU-s, base {base:.1f} s / {base_cpu:.1f} CPU-s, "
          f"wall ratio {ours / base:.2f}, CPU ratio {ours_cpu / base_cpu:.2f}; outcome {first.get('outcome')}, "
          f"{first.get('tensors_offered'):,} tensors offered, {first.get('mtp_tensors_loaded')} MTP tensors "
          f"loaded; same VerifyResult in all {2 * args.runs} runs: {same}; load after {os.getloadavg()[0]:.1f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
