"""Hub reading benchmark: ckptinspect's header reader vs huggingface_hub's get_safetensors_metadata.

Serves the full-scale sparse replica of nvidia/Qwen3.5-397B-A17B-NVFP4 (fixtures.replica: 94 shards, real
tensor names / dtypes / shapes, data regions are holes) with tests/hub_server.py and ``--latency-ms`` added
to every request, then measures, in one run, on the same server, with a cold HF cache for every run:

- fetch:  ``open_hub`` alone: file list, small JSON files, every header (ckptinspect.sources.hub);
- report: ``ckptinspect report org/name --format json --quiet`` in a subprocess (the whole command:
          start-up, fetch, parsing every header, the full report);
- theirs: ``HfApi(endpoint=...).get_safetensors_metadata(repo)``.

Requests and bytes are counted by the server (every HTTP request received, body bytes sent). Targets of
issue 4: requests <= shards + 5; bytes <= 1.05 x (header bytes + small JSON files); wall <= 0.5 x theirs.

    python benchmarks/bench_hub.py [--replica DIR] [--latency-ms 20] [--runs 3] [--redirects]
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
_CACHE = Path(tempfile.mkdtemp(prefix="bench_hub_hf_"))
os.environ["HF_HOME"] = str(_CACHE)  # before huggingface_hub is imported: its constants read it once
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("HF_TOKEN", None)
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hub_server_process import ServerProcess  # noqa: E402

REPO = "nvidia/Qwen3.5-397B-A17B-NVFP4"
SMALL_JSON = ("config.json", "hf_quant_config.json", "model.safetensors.index.json", "generation_config.json")


def _cold_cache() -> None:
    shutil.rmtree(_CACHE / "hub", ignore_errors=True)


def _measure(server: ServerProcess, fn) -> dict:
    _cold_cache()
    server.reset_stats()
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    stats = server.stats()
    hops = sum(1 for entry in stats["log"] if entry[3] in (301, 302, 303, 307, 308))
    return {"wall": wall, "requests": stats["requests"], "hops": hops, "bytes": stats["bytes"], "result": result}


def ours_fetch(server: ServerProcess) -> int:
    from ckptinspect.sources.hub import open_hub

    return len(open_hub(REPO, endpoint=server.url, progress=False).headers)


def theirs(server: ServerProcess) -> int:
    from huggingface_hub import HfApi

    meta = HfApi(endpoint=server.url).get_safetensors_metadata(REPO)
    return sum(len(m.tensors) for m in meta.files_metadata.values())


def report(server: ServerProcess) -> int:
    env = {**os.environ, "HF_ENDPOINT": server.url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "report", REPO, "--format", "json", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replica", type=Path, help="an existing replica directory (else built in a temp dir)")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--redirects", action="store_true", help="redirect shard GETs to a CDN port, like huggingface.co")
    ap.add_argument("--no-report", action="store_true", help="skip the `ckptinspect report` subprocess")
    args = ap.parse_args(argv)

    replica = args.replica
    if replica is None:
        from fixtures.replica import build_replica

        t0 = time.perf_counter()
        replica = build_replica(Path(tempfile.mkdtemp(prefix="bench_hub_replica_")))
        print(f"built replica in {time.perf_counter() - t0:.1f} s: {replica}")
    shards = sorted(p.name for p in replica.glob("*.safetensors"))
    header_bytes = 0
    for shard in shards:
        with open(replica / shard, "rb") as fh:
            header_bytes += int.from_bytes(fh.read(8), "little")
    json_bytes = sum((replica / n).stat().st_size for n in SMALL_JSON if (replica / n).exists())
    print(f"replica: {len(shards)} shards, {header_bytes:,} header bytes "
          f"({sum(1 for s in shards if _n(replica / s) > 100_000)} headers > 100,000 B), "
          f"{json_bytes:,} bytes of small JSON files; latency {args.latency_ms:g} ms/request; "
          f"CDN redirects {'on' if args.redirects else 'off'}; 1 warm-up + {args.runs} runs each, cold HF cache every run, "
          f"median wall; requests/bytes as counted by the server (last run)")

    rows = []
    with ServerProcess({REPO: replica}, latency_ms=args.latency_ms, redirects=args.redirects) as server:
        tools = [("ckptinspect open_hub (fetch only)", ours_fetch), ("get_safetensors_metadata", theirs)]
        if not args.no_report:
            tools.insert(1, ("ckptinspect report (subprocess)", report))
        for name, fn in tools:
            runs = []
            try:
                _measure(server, lambda: fn(server))  # warm-up, not reported: imports, first connections
                for _ in range(args.runs):
                    runs.append(_measure(server, lambda: fn(server)))
            except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash
                rows.append((name, None, None, None, None, f"failed: {exc}"))
                continue
            walls = [r["wall"] for r in runs]
            last = runs[-1]
            rows.append((name, last["requests"], last["hops"], last["bytes"], statistics.median(walls),
                         f"{min(walls):.3f}"))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'tool':<{width}}  {'requests':>8}  {'redirects':>9}  {'bytes':>13}  {'wall s':>7}  {'min s':>7}")
    for name, req, hops, nbytes, wall, note in rows:
        if req is None:
            print(f"{name:<{width}}  {note}")
        else:
            print(f"{name:<{width}}  {req:>8}  {hops:>9}  {nbytes:>13,}  {wall:>7.3f}  {note:>7}")
    base = next((r for r in rows if r[0] == "get_safetensors_metadata" and r[1] is not None), None)
    base_wall = base[4] if base is not None else None
    budget_bytes = 1.05 * (header_bytes + json_bytes)
    print("\ntargets (issue 4):")
    for name, req, hops, nbytes, wall, _ in rows:
        if req is None or name == "get_safetensors_metadata":
            continue
        # A redirect answer is a hop of the client's request (the CDN serves it), not a request of its own.
        ok_req = req - hops <= len(shards) + 5
        ok_bytes = nbytes <= budget_bytes
        asked = f"{req - hops} ({req} with {hops} redirect hops)" if hops else f"{req}"
        line = (f"  {name}: requests {asked} <= {len(shards) + 5} {'OK' if ok_req else 'MISSED'}; "
                f"bytes {nbytes / (header_bytes + json_bytes):.3f}x <= 1.05x {'OK' if ok_bytes else 'MISSED'}")
        if base is not None:
            ratio = wall / base_wall
            line += f"; wall {ratio:.2f}x of get_safetensors_metadata <= 0.5x {'OK' if ratio <= 0.5 else 'MISSED'}"
        print(line)
    return 0


def _n(path: Path) -> int:
    with open(path, "rb") as fh:
        return int.from_bytes(fh.read(8), "little")


if __name__ == "__main__":
    sys.exit(main())
