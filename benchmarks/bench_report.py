"""Benchmark: `ckptinspect report` on the full-scale nvidia/Qwen3.5-397B-A17B-NVFP4 layout replica.

Prints, measured side by side in one run (alternating, median of N):
- wall time of `ckptinspect report DIR --format json` vs the floor (benchmarks/floor_read_headers.py:
  read the index and every header, JSON-parse them, nothing else), and their ratio (target <= 1.5);
- `ckptinspect --help` wall time (target < 0.3 s);
- the share of the report spent in the rules stage (load + match + assess_mtp; target < 20%).

Usage: python benchmarks/bench_report.py [--replica DIR] [--repeat N]
The replica (94 sparse shards, ~370k tensors, ~0.1 GB on disk) is built by fixtures/replica.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def rules_share(model: str, repeat: int) -> tuple[float, float]:
    """(median report seconds in-process, median seconds of the rules stage within it)."""
    import ckptinspect.pipeline as pipeline
    import ckptinspect.readiness as readiness
    from ckptinspect.sources import open_source

    spent = {"rules": 0.0}
    real_load, real_assess = readiness.load_rules, readiness.assess_mtp

    def timed(fn):
        def inner(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent["rules"] += time.perf_counter() - t
        return inner

    readiness.load_rules = timed(real_load)
    readiness.assess_mtp = timed(real_assess)
    totals, rules = [], []
    try:
        for _ in range(repeat):
            spent["rules"] = 0.0
            t = time.perf_counter()
            pipeline.report_from_raw(open_source(model, progress=False))
            totals.append(time.perf_counter() - t)
            rules.append(spent["rules"])
    finally:
        readiness.load_rules, readiness.assess_mtp = real_load, real_assess
    return statistics.median(totals), statistics.median(rules)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica", type=Path, help="existing replica directory (else built in a temp dir)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.replica:
        model = args.replica
    else:
        from fixtures.replica import build_replica

        model = build_replica(Path(tempfile.mkdtemp(prefix="ckptinspect-replica-")))
    # An installed package has its bytecode (pip compiles it); an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile ~120 modules on every run (~0.1 s the floor never pays).
    import compileall

    compileall.compile_dir(str(ROOT / "ckptinspect"), quiet=1)
    exe = [sys.executable, "-m", "ckptinspect"]
    floor_cmd = [sys.executable, str(ROOT / "benchmarks" / "floor_read_headers.py"), str(model)]
    report_cmd = exe + ["report", str(model), "--format", "json", "--quiet"]
    load_at_start = os.getloadavg()[0]
    wall(floor_cmd), wall(report_cmd)  # warm the page cache
    floors, reports, helps = [], [], []
    for _ in range(args.repeat):
        floors.append(wall(floor_cmd))
        reports.append(wall(report_cmd))
        helps.append(wall(exe + ["--help"]))
    floor, report, help_s = (statistics.median(x) for x in (floors, reports, helps))
    paired = statistics.median(r / f for r, f in zip(reports, floors))
    in_process, rules = rules_share(str(model), max(3, args.repeat // 2))
    rows = [
        ("floor (index + headers, json only)", f"{floor:.3f} s", ""),
        ("ckptinspect report --format json", f"{report:.3f} s", f"ratio {report / floor:.2f}x (target <= 1.5x); "
                                                                 f"median of paired ratios {paired:.2f}x"),
        ("report wall", f"{report:.3f} s", "target < 1.5 s on 2 cores"),
        ("ckptinspect --help", f"{help_s:.3f} s", "target < 0.3 s"),
        ("rules stage (in-process)", f"{rules:.3f} s", f"{100 * rules / max(1e-9, in_process - rules):.1f}% of the "
                                                        "rest of the report (target < 20%)"),
    ]
    print(f"replica: {model}  repeats: {args.repeat} (median)  load average {load_at_start:.1f} "
          f"before the runs, {os.getloadavg()[0]:.1f} after")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>9}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
