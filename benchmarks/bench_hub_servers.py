"""Hub speed on two server implementations: the project's test server (tests/hub_server.py: HTTP/1.1
keep-alive, backlog 256) and a plain ``http.server`` one (tests/plain_hub_server.py: HTTP/1.0, one
connection per request, backlog 5), both with the same delay per request, serving the full-scale sparse
replica of nvidia/Qwen3.5-397B-A17B-NVFP4. In one run, alternating tools per round, cold HF cache:

- report: ``ckptinspect report org/name --format json --quiet --verbose`` (subprocess; phases from
  --verbose: info_s, json_s, headers_s);
- theirs: ``HfApi.get_safetensors_metadata`` (subprocess too, so both pay interpreter start-up).

    python benchmarks/bench_hub_servers.py [--replica DIR] [--latency-ms 20] [--runs 3] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = "nvidia/Qwen3.5-397B-A17B-NVFP4"
THEIRS = ("import sys; from huggingface_hub import HfApi; "
          "m = HfApi(endpoint=sys.argv[1]).get_safetensors_metadata(sys.argv[2]); "
          "print(sum(len(f.tensors) for f in m.files_metadata.values()))")


class _Served:
    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _env(url: str, home: str, workers: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    env.update(HF_ENDPOINT=url, HF_HOME=home, PYTHONPATH=str(ROOT))
    if workers:
        env["CKPTINSPECT_MAX_WORKERS"] = str(workers)
    return env


def _report(url: str, workers: int | None) -> tuple[float, dict[str, str]]:
    home = tempfile.mkdtemp(prefix="bench_hf_")
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ckptinspect", "report", REPO, "--format", "json", "--quiet",
                               "--verbose"], capture_output=True, text=True, env=_env(url, home, workers), timeout=600)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr.strip()[-300:])
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("stats: "))
    stats = dict(part.split("=", 1) for part in line[len("stats: "):].split(", "))
    return wall, stats


def _theirs(url: str) -> float:
    home = tempfile.mkdtemp(prefix="bench_hf_")
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", THEIRS, url, REPO], capture_output=True, text=True,
                              env=_env(url, home, None), timeout=600)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-300:])
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="CKPTINSPECT_MAX_WORKERS for report")
    args = ap.parse_args()
    replica = args.replica
    if replica is None:
        sys.path.insert(0, str(ROOT))
        from fixtures.replica import build_replica

        replica = build_replica(Path(tempfile.mkdtemp(prefix="bench_hub_replica_")))
    servers = {
        "test server (HTTP/1.1 keep-alive)": [sys.executable, str(ROOT / "tests" / "hub_server_process.py"),
                                              "--latency-ms", str(args.latency_ms), REPO, str(replica)],
        "plain http.server (HTTP/1.0)": [sys.executable, str(ROOT / "tests" / "plain_hub_server.py"),
                                         "--latency-ms", str(args.latency_ms), REPO, str(replica)],
    }
    print(f"latency {args.latency_ms:g} ms per request, {args.runs} runs after 1 warm-up, median; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    for name, cmd in servers.items():
        served = _Served(cmd)
        try:
            _report(served.url, args.workers), _theirs(served.url)  # warm-up: page cache, imports
            ours, phases, theirs = [], [], []
            for _ in range(args.runs):
                wall, stats = _report(served.url, args.workers)
                ours.append(wall)
                phases.append(stats)
                theirs.append(_theirs(served.url))
        finally:
            served.close()
        med = {k: statistics.median(float(p[k]) for p in phases) for k in ("info_s", "json_s", "headers_s")}
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"{name}: report {o:.3f} s (runs {', '.join(f'{w:.2f}' for w in ours)}), get_safetensors_metadata "
              f"{t:.3f} s (runs {', '.join(f'{w:.2f}' for w in theirs)}): {o / t:.2f}x; report phases: repo info "
              f"{med['info_s']:.3f} s, JSON files {med['json_s']:.3f} s, headers {med['headers_s']:.3f} s; "
              f"requests {phases[-1]['requests']}, bytes {int(phases[-1]['bytes_fetched']):,}")
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
