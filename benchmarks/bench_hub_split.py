"""Where a remote `report`'s CPU goes, against get_safetensors_metadata's: one child per round reads the
397B replica from the test Hub server (cold HF cache and header cache) and reports, from inside, the CPU
spent up to the end of the Hub read (interpreter start, imports, requests, index parse and summary) and
the CPU of the scan of the 94 headers (parse + validate + group, in-process), then its whole CPU; the
same round runs ``get_safetensors_metadata`` for the ratio. Alternating order, load printed.

    python benchmarks/bench_hub_split.py --replica DIR [--runs 3] [--server keepalive|plain]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
from bench_hub_paired import _run  # noqa: E402
from bench_hub_servers import REPO, THEIRS, add_replica_server_options, serve_replica  # noqa: E402

# Prints "read_cpu scan_cpu" (process CPU seconds at the end of the Hub read, and the scan's).
CHILD = ("import sys, time; from ckptinspect.sources.hub import open_hub; "
         "raw = open_hub(sys.argv[1], progress=False); read = time.process_time(); "
         "from ckptinspect.inventory.scan import scan_checkpoint; scan_checkpoint(raw); "
         "print(read, time.process_time() - read)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replica_server_options(ap)
    args = ap.parse_args()
    served = serve_replica(args)
    rows: dict[str, list[float]] = {"read": [], "scan": [], "ours": [], "theirs": []}
    out: list[str] = []

    def ours() -> None:
        wall, cpu = _run([sys.executable, "-c", CHILD, REPO], ROOT, served.url, out)
        read, scan = map(float, out[-1].split())
        rows["read"].append(read)
        rows["scan"].append(scan)
        rows["ours"].append(cpu)

    def theirs() -> None:
        rows["theirs"].append(_run([sys.executable, "-c", THEIRS, served.url, REPO], ROOT, served.url)[1])

    try:
        ours(), theirs()  # warm-up: page cache, bytecode
        for key in rows:
            rows[key].clear()
        for round_no in range(args.runs):
            load = os.getloadavg()[0]
            for step in ((ours, theirs) if round_no % 2 == 0 else (theirs, ours)):
                step()
            print(f"{args.server} round {round_no + 1} (load {load:.1f}): read {rows['read'][-1]:.2f} + scan "
                  f"{rows['scan'][-1]:.2f} CPU-s (whole child {rows['ours'][-1]:.2f}), theirs {rows['theirs'][-1]:.2f} "
                  "CPU-s", flush=True)
    finally:
        served.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{args.server} medians: read {med['read']:.3f} ({med['read'] / med['theirs']:.2f}x theirs), scan "
          f"{med['scan']:.3f} ({med['scan'] / med['theirs']:.2f}x), theirs {med['theirs']:.3f} CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
