"""Remote report through both test Hub servers, paired and alternating, wall and CPU: this checkout's
``ckptinspect report``, another checkout's (``--base``, e.g. the previous main) and huggingface_hub's
``get_safetensors_metadata``, each a subprocess with a cold HF cache and a cold header cache, the load
average printed per round.
CPU is the subprocess's user + system time, children included, so it stays comparable when the
machine is busy (wall time then mostly measures the wait for a core).

    python benchmarks/bench_hub_paired.py --replica DIR --base /path/to/other/checkout [--runs 3]
        [--server keepalive|plain] [--latency-ms 20] [--format json|text|markdown]
"""

from __future__ import annotations

import argparse
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
from bench_hub_servers import REPO, THEIRS, add_replica_server_options, serve_replica  # noqa: E402


def _run(args: list[str], root: Path, url: str, out: list[str] | None = None) -> tuple[float, float]:
    """(wall, CPU) of one cold run; its stdout is appended to ``out`` when given."""
    home = tempfile.mkdtemp(prefix="bench_hf_")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    # Cold for every tool: a fresh HF cache and a fresh header cache (sources/header_cache.py keys entries
    # by endpoint and commit, so a shared one would answer every round after the first from disk).
    env.update(HF_ENDPOINT=url, HF_HOME=home, PYTHONPATH=str(root), CKPTINSPECT_CACHE_DIR=str(Path(home) / "ckptinspect"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(root))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{args[:4]} failed: {done.stderr[-500:]}")
    if out is not None:
        out.append(done.stdout)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replica_server_options(ap)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--format", default="json", help="report's --format (text: what a terminal shows)")
    args = ap.parse_args()
    served = serve_replica(args)
    report = [sys.executable, "-m", "ckptinspect", "report", REPO, "--format", args.format, "--quiet"]
    tools = {"ours": lambda: _run(report, ROOT, served.url),
             "base": lambda: _run(report, args.base.resolve(), served.url),
             "theirs": lambda: _run([sys.executable, "-c", THEIRS, served.url, REPO], ROOT, served.url)}
    try:
        for tool in tools.values():  # warm-up: page cache, bytecode
            tool()
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in tools}
        for round_no in range(args.runs):
            order = list(tools) if round_no % 2 == 0 else list(tools)[::-1]
            load = os.getloadavg()[0]
            line = []
            for name in order:
                wall, cpu = tools[name]()
                results[name].append((wall, cpu))
                line.append(f"{name} {wall:.2f} s / {cpu:.2f} CPU-s")
            print(f"{args.server} round {round_no + 1} (load {load:.1f}): " + ", ".join(line), flush=True)
    finally:
        served.close()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    t_wall, t_cpu = med["theirs"]
    print(f"{args.server} medians: " + ", ".join(f"{k} {w:.3f} s / {c:.3f} CPU-s" for k, (w, c) in med.items())
          + f"; ours/theirs wall {med['ours'][0] / t_wall:.2f} CPU {med['ours'][1] / t_cpu:.2f}"
          + f"; base/theirs wall {med['base'][0] / t_wall:.2f} CPU {med['base'][1] / t_cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
