"""CPU of the per-shard scan (inventory/scan.py) over a checkpoint's headers: this checkout against another.

Each round starts one process per checkout (alternating which goes first; PYTHONPATH set to the
checkout, PYTHONHASHSEED=0 so the name fingerprints compare), which reads every shard's header bytes into
memory once, then times ``scan_header_unpaused`` over all of them ``--reps`` times with
``time.process_time`` (the cyclic GC paused, as the scan runs in the report) and prints the best and
the median. The medians of those per-process medians and their ratio are printed at the end, with
whether both checkouts' scans were equal (a digest of every ShardScan). ``--report`` adds paired runs
of the whole ``report --format json`` per checkout (the CPU of the child, user + system) and checks
that both print the same bytes.

    python benchmarks/bench_scan_cpu.py --replica DIR --base /path/to/other/checkout [--runs 5] [--reps 5] [--report]
        [--synthetic unique-digitless|unique-masks|one-bucket]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in the measured checkout's interpreter: argv = replica, reps.
_CHILD = r"""
import gc, hashlib, json, os, statistics, struct, sys, time
from pathlib import Path
replica, reps = sys.argv[1], int(sys.argv[2])
headers = []
if replica.startswith("synthetic:"):  # one header per kind of name set, 100k tensors each, compact
    import random, string
    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(12))
    kinds = {"unique-digitless": [f"model.{word()}.weight" for _ in range(100000)],
             "unique-masks": [f"m.{word()}.{i % 7}.w" for i in range(100000)],
             "one-bucket": [f"m.layers.{i // 1000}.e.{i % 1000}.w" for i in range(100000)]}
    kind_names = kinds[replica.split(":", 1)[1]]
    text = ",".join('"%s":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}' % (n, i, i + 1)
                    for i, n in enumerate(kind_names))
    data = ("{" + text + "}").encode()
    headers.append(("synthetic.safetensors", data, 8 + len(data) + len(kind_names)))
else:
    for path in sorted(Path(replica).glob("*.safetensors")):
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            headers.append((path.name, fh.read(length), path.stat().st_size))
from ckptinspect.inventory.scan import scan_header_unpaused
gc.disable()
times = []
for _ in range(reps):
    start = time.process_time()
    scans = [scan_header_unpaused(shard, data, size) for shard, data, size in headers]
    times.append(time.process_time() - start)
    del scans
scans = [scan_header_unpaused(shard, data, size) for shard, data, size in headers]
digest = hashlib.sha256(repr([(s, sorted(s.groups.items(), key=repr)) for s in scans]).encode()).hexdigest()
print(json.dumps({"best": min(times), "median": statistics.median(times), "digest": digest,
                  "tensors": sum(s.tensors for s in scans), "shards": len(scans)}))
"""


def _env(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(checkout), "PYTHONHASHSEED": "0"}


def _scan(checkout: Path, replica: str, reps: int) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(replica), str(reps)], capture_output=True,
                          text=True, env=_env(checkout), cwd=str(checkout), check=True)
    return json.loads(done.stdout)


def _report(checkout: Path, replica: str) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "ckptinspect", "report", str(replica), "--format", "json",
                           "--quiet"], capture_output=True, text=True, env=_env(checkout), cwd=str(checkout))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def _paired(label: str, tools: dict[str, Path], runs: int, measure) -> dict[str, list]:
    results: dict[str, list] = {name: [] for name in tools}
    for round_no in range(runs):
        order = list(tools) if round_no % 2 == 0 else list(tools)[::-1]
        load = os.getloadavg()[0]
        took = {name: measure(tools[name]) for name in order}
        for name, value in took.items():
            results[name].append(value)
        print(f"{label} round {round_no + 1} (load {load:.1f}): "
              + ", ".join(f"{name} {_cpu(value):.3f} CPU-s" for name, value in took.items()), flush=True)
    return results


def _cpu(value) -> float:
    return value["median"] if isinstance(value, dict) else value[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", required=True, help="checkpoint directory (ignored with --synthetic)")
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=5, help="paired rounds (one process per checkout each)")
    ap.add_argument("--reps", type=int, default=5, help="scans of all headers per process")
    ap.add_argument("--report", action="store_true", help="also pair whole `report --format json` runs")
    ap.add_argument("--synthetic", choices=["unique-digitless", "unique-masks", "one-bucket"],
                    help="instead of the replica, one generated 100k-tensor header of this kind of names")
    args = ap.parse_args()
    tools = {"this checkout": ROOT, "base": args.base.resolve()}
    if args.synthetic:
        if args.report:
            ap.error("--report reads a checkpoint directory: not with --synthetic")
        args.replica = f"synthetic:{args.synthetic}"
    scans = _paired("scan", tools, args.runs, lambda path: _scan(path, args.replica, args.reps))
    ours = statistics.median(_cpu(v) for v in scans["this checkout"])
    base = statistics.median(_cpu(v) for v in scans["base"])
    first = scans["this checkout"][0]
    same = {v["digest"] for values in scans.values() for v in values} == {first["digest"]}
    print(f"scan of {first['shards']} headers, {first['tensors']:,} tensors, median of per-process medians: "
          f"this checkout {ours:.3f} CPU-s, base {base:.3f} CPU-s, ratio {ours / base:.2f}; same scans: {same}")
    if args.report:
        reports = _paired("report", tools, args.runs, lambda path: _report(path, args.replica))
        ours = statistics.median(v[0] for v in reports["this checkout"])
        base = statistics.median(v[0] for v in reports["base"])
        same = len({v[1] for values in reports.values() for v in values}) == 1
        print(f"report --format json, median CPU (user + system): this checkout {ours:.3f} CPU-s, "
              f"base {base:.3f} CPU-s, ratio {ours / base:.2f}; same report JSON: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
