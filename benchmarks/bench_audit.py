"""Audit benchmark (issue 24): 100 generated repos on the test Hub server at 20 ms per request.

Serves 100 repos (the tiny generated fixtures of fixtures/generate.py, several formats, each under a few
repo ids), all tagged ``base_model:quantized:bench-base/Base`` (tests/hub_server_process.py, its own
process), then measures in one run, on the same server, with a cold HF cache each time:

- single: ``ckptinspect report REPO --format json --quiet`` for every repo, one after another (the whole
          command each: start-up, Hub reads, the report): wall per repo, requests per repo;
- audit:  ``ckptinspect audit --quantized-from bench-base/Base --format jsonl --quiet`` with an empty
          audit cache (the listing included), then once more with the cache it left (``warm``).

Targets of issue 24: audit wall <= 2 x the slowest single report + 10 s; audit requests <= 1.1 x the sum
of the single reports' requests. The load average is printed before and after each phase (the machine
is shared); ``--order audit-first`` / ``singles-first`` pairs the two phases either way round.

    python benchmarks/bench_audit.py [--repos 100] [--latency-ms 20] [--jobs 8] [--order audit-first]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TMP = Path(tempfile.mkdtemp(prefix="bench_audit_"))
os.environ["HF_HOME"] = str(_TMP / "hf")
os.environ["CKPTINSPECT_CACHE_DIR"] = str(_TMP / "ckcache")
for var in ("HF_HUB_OFFLINE", "HF_TOKEN", "CKPTINSPECT_DEADLINE_S"):
    os.environ.pop(var, None)
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hub_server_process import ServerProcess  # noqa: E402

BASE = "bench-base/Base"
FIXTURES = ("qwen3_5_moe_nvfp4", "qwen3_5_moe_ct_nvfp4", "qwen3_5_moe_nvfp4_nomtp", "qwen3_5_moe_mtp_incomplete",
            "deepseek_v3_fp8", "deepseek_v3_nvfp4", "glm4_moe", "mimo_7b", "gpt_oss_mxfp4", "llama_bf16",
            "llama_awq", "llama_gptq", "qwen3_5_moe_gptq_int4_bf16_mtp", "kimi_k2", "minimax_m2", "nemotron_h",
            "ernie4_5_moe", "qwen3_next_bf16", "qwen3_moe_bf16", "broken_truncated_header")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cold() -> None:
    shutil.rmtree(_TMP / "hf", ignore_errors=True)


def _run(server: ServerProcess, args: list[str]) -> tuple[float, int, subprocess.CompletedProcess]:
    _cold()
    server.reset_stats()
    env = {**os.environ, "HF_ENDPOINT": server.url, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, env=env,
                          timeout=900)
    wall = time.perf_counter() - t0
    return wall, server.stats()["requests"], done


def singles(server: ServerProcess, repos: list[str]) -> list[tuple[str, float, int, int]]:
    out = []
    for repo in repos:
        wall, requests, done = _run(server, ["report", repo, "--format", "json", "--quiet"])
        out.append((repo, wall, requests, done.returncode))
    return out


def audit(server: ServerProcess, jobs: int, *, cold_cache: bool) -> tuple[float, int, list[dict]]:
    if cold_cache:
        shutil.rmtree(_TMP / "ckcache", ignore_errors=True)
    wall, requests, done = _run(server, ["audit", "--quantized-from", BASE, "--format", "jsonl", "--quiet",
                                         "--jobs", str(jobs)])
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return wall, requests, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repos", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--order", choices=("audit-first", "singles-first"), default="audit-first")
    args = ap.parse_args(argv)
    from fixtures.generate import build_fixture

    built = {name: build_fixture(name, _TMP / "fixtures") for name in FIXTURES}
    repos = {f"q{i:03d}/{FIXTURES[i % len(FIXTURES)]}": built[FIXTURES[i % len(FIXTURES)]]
             for i in range(args.repos)}
    tags = {repo: (f"base_model:quantized:{BASE}",) for repo in repos}
    with ServerProcess(repos, latency_ms=args.latency_ms, redirects=True, tags=tags) as server:
        print(f"{args.repos} repos, {args.latency_ms:g} ms per request, jobs {args.jobs}, "
              f"{os.cpu_count()} CPUs, order {args.order}")
        phases = ("audit", "singles") if args.order == "audit-first" else ("singles", "audit")
        for phase in phases:
            before = load()
            if phase == "audit":
                a_wall, a_req, rows = audit(server, args.jobs, cold_cache=True)
                w_wall, w_req, w_rows = audit(server, args.jobs, cold_cache=False)
                print(f"audit:   {a_wall:6.2f} s, {a_req} requests, {len(rows)} rows "
                      f"({sum(r['status'] == 'ok' for r in rows)} ok); warm re-run {w_wall:.2f} s, {w_req} requests, "
                      f"{sum(r['cached'] for r in w_rows)} cached   [load {before} -> {load()}]")
            else:
                single = singles(server, list(repos))
                slowest = max(single, key=lambda s: s[1])
                s_req = sum(s[2] for s in single)
                print(f"singles: slowest {slowest[1]:.2f} s ({slowest[0]}), median "
                      f"{sorted(s[1] for s in single)[len(single) // 2]:.2f} s, sum {sum(s[1] for s in single):.1f} s, "
                      f"{s_req} requests   [load {before} -> {load()}]")
        limit = 2 * slowest[1] + 10
        print(f"wall:     audit {a_wall:.2f} s vs limit 2 x {slowest[1]:.2f} + 10 = {limit:.2f} s -> "
              f"{'PASS' if a_wall <= limit else 'FAIL'}")
        print(f"requests: audit {a_req} vs limit 1.1 x {s_req} = {1.1 * s_req:.0f} -> "
              f"{'PASS' if a_req <= 1.1 * s_req else 'FAIL'}")
    shutil.rmtree(_TMP, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
