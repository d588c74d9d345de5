"""GGUF header reads: local parse time and Hub ranges for a large tokenizer (BENCHMARKS.md section 8).

    python benchmarks/bench_gguf.py [--tokens 600000] [--runs 5]

Writes one GGUF with ``--tokens`` tokenizer strings (the gguf package's writer, tiny tensors), then
measures: the local parse (best / median of ``--runs``), and a Hub read through tests/hub_server.py on
127.0.0.1 (requests, bytes received against the header bytes, wall time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=600_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from fixtures.gguf_models import MODELS, write_model
    from hub_server import HubServer

    from ckptinspect.sources import open_source
    from ckptinspect.sources.gguf_local import read_gguf_header

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        tokens = [f"tok-{i:09d}" for i in range(args.tokens)]
        model = replace(MODELS["GLM-4.5-Air-Q4_K_M"], name="Bench-Q4_K_M",
                        extra_kv={"tokenizer.ggml.tokens": ("strs", tokens)})
        path = write_model(model, root)[0]
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            header = read_gguf_header(path, source=str(path))
            times.append(time.perf_counter() - t)
        print(f"local: {args.tokens:,} tokens, header {header.header_bytes:,} B, parse best {min(times):.3f} s, "
              f"median {statistics.median(times):.3f} s")
        os.environ.pop("HF_HUB_OFFLINE", None)
        with HubServer() as server:
            server.add_repo("bench/Bench-GGUF", root)
            os.environ["HF_ENDPOINT"] = server.url
            os.environ["HF_HOME"] = str(Path(tmp) / "hf")
            t = time.perf_counter()
            raw = open_source("bench/Bench-GGUF", progress=False)
            wall = time.perf_counter() - t
        s = raw.stats
        print(f"hub: {s['requests']} requests (1 repo info), {s['bytes_received']:,} B received for a "
              f"{s['header_bytes']:,} B header ({s['bytes_received'] / s['header_bytes']:.4f}x), {wall:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
