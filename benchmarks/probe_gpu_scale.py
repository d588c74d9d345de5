"""GPU benchmark of the probe on real-sized inputs (issue 22), one H200, one process, one JSON.

Sections (``--sections``), each measured in this run, on the random-weight DeepSeek-V3-shaped MoE
of benchmarks/probe_gpu.py (2.48 B params) unless named q397:
  build          that model
  hf_mtp         transformers generate(..., use_mtp=True), default settings, batch 1, 6 built-in prompts
                 (one per category) x 48 tokens: verify steps / s, the baseline
  teacher        probe --mode teacher, default settings (batches sized by the estimate), 65k-token corpus
  teacher_b8, teacher_b32   the same at --batch-size 8 / 32 (the earlier default and setting)
  big_corpus     ~300k tokens in documents of 100-4,000 tokens (the shape that was refused before)
  long_doc       one 32,768-token document, default settings (blocked draft-stream attention)
  long_equal     one 4,096-token document twice: dense mask (ample memory) and blocked (memory where the
                 dense scratch does not fit): the same counts
  stream_*       the 65k corpus layer-streamed under --max-gpu-memory 4 (below the 5 GB of weights), 8k-token
                 chunks: residual stream on the device (auto), in pinned host memory, and in 3 rounds (host
                 budget a third of the stream); page cache dropped before each run (not between rounds)
  greedy         probe --mode greedy, default settings (144 built-in prompts, batch = as many as fit)
  greedy_static  transformers generate on the same batch with cache_implementation="static" against the
                 default dynamic cache (the decode loop that is most of greedy mode's time)
  synthetic      greedy, --categories chat,synthetic (24 synthetic id prompts of 1,024 tokens)
  ceilings       disk read bandwidth (8 GiB, page cache dropped) and the device copy / matmul ceilings
  q397           as many full-width Qwen3.5-397B-A17B-NVFP4 decoder layers as the disk holds (a multiple
                 of 4), teacher mode layer-streamed on a >= 100k-token corpus under --max-gpu-memory 60,
                 page cache dropped: per-layer read / compute times, read bandwidth vs the disk's, peak
                 memory vs the estimate; then the same with the host store

    python benchmarks/probe_gpu_scale.py --out DIR --sections a,b,...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import probe_gpu as pg  # noqa: E402
import torch  # noqa: E402

RESULTS: dict = {}


def corpus(path: str, tokens: int, lengths: tuple[int, ...] = (500,)) -> str:
    """Documents of the fixtures' answer texts (byte-level tokens ~ characters), cycling ``lengths``."""
    import build_fixtures as bf

    base = "".join(bf.ANSWERS)
    text = base * (2 * max(lengths) // len(base) + 2)
    docs, n, i = [], 0, 0
    while n < tokens:
        size = lengths[i % len(lengths)]
        start = (i * 997) % (len(text) - size - 1)
        docs.append(text[start:start + size].replace("\n\n", "\n").strip())
        n += size
        i += 1
    with open(path, "w") as fh:
        fh.write("\n\n".join(docs))
    return path


def brief(run: dict) -> dict:
    keep = ("wall_s", "scored", "samples_per_s", "timings_s", "tokens_scored", "peak_bytes", "estimate_bytes",
            "peak_over_estimate", "batch_size", "histogram", "alpha", "counts")
    out = {k: run.get(k) for k in keep}
    out["attention"] = run.get("attention")
    if "streaming" in run:
        s = run["streaming"]
        out["streaming"] = {k: s.get(k) for k in ("layers", "bytes_read", "read_s", "compute_s", "read_bandwidth_gb_s",
                                                   "store", "rounds", "store_bytes_moved", "estimate_bytes",
                                                   "per_layer", "peak_bytes")}
    return out


def probe(path: str, **kw) -> dict:
    from ckptinspect.probe.runner import run_probe
    from ckptinspect.render.probe_out import probe_json

    cuda = pg.DEV.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(pg.DEV)
    t0 = time.perf_counter()
    doc = probe_json(run_probe(path, device=pg.DEV, progress=False, **kw))
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(pg.DEV) if cuda else 1
    if doc.get("peak_bytes_by_phase"):
        peak = max(doc["peak_bytes_by_phase"].values())
    est = doc["streaming"]["estimate_bytes"]["total"] if "streaming" in doc else doc["memory_estimate_bytes"]
    scored = doc["overall"]["depths"][0]["scored"]
    out = {"wall_s": wall, "scored": scored, "samples_per_s": scored / wall, "timings_s": doc.get("timings_s"),
           "tokens_scored": doc.get("tokens_scored"), "peak_bytes": peak, "estimate_bytes": est,
           "peak_over_estimate": peak / est, "batch_size": doc.get("batch_size"), "attention": doc.get("attention"),
           "histogram": doc["overall"]["histogram"],
           "counts": [(d["scored"], d["reached"], d["accepted"]) for d in doc["overall"]["depths"]],
           "alpha": [d["conditional"] for d in doc["overall"]["depths"]],
           "categories": {c: v["depths"][0]["conditional"] for c, v in doc["categories"].items()}}
    if "streaming" in doc:
        out["streaming"] = doc["streaming"]
    return out


def greedy_static(path: str, prompts: int = 144, new: int = 256) -> dict:
    """transformers generate on the probe's default greedy batch, dynamic vs static KV cache."""
    import build_fixtures as bf  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ckptinspect.probe.prompts import builtin_prompts, encode_prompt

    tok = AutoTokenizer.from_pretrained(path)
    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(pg.DEV).eval()
    ids = [encode_prompt(tok, p, chat=True, vocab_size=None, source=path) for p in builtin_prompts()[:prompts]]
    width = max(map(len, ids))
    x = torch.full((len(ids), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(x)
    for r, p in enumerate(ids):
        x[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    x, mask = x.to(pg.DEV), mask.to(pg.DEV)
    out = {}
    for name, kw in (("dynamic", {}), ("static", {"cache_implementation": "static"})):
        try:
            with torch.no_grad():
                main.generate(input_ids=x[:8], attention_mask=mask[:8], do_sample=False, max_new_tokens=8,
                              pad_token_id=tok.pad_token_id, **kw)  # warm-up
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                g = main.generate(input_ids=x, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                  min_new_tokens=new, pad_token_id=tok.pad_token_id, **kw)
                torch.cuda.synchronize()
            out[name] = {"seconds": time.perf_counter() - t0, "tokens": int((g.shape[1] - width) * g.shape[0]),
                         "first_row": g[0, width:width + 16].tolist()}
        except Exception as exc:  # noqa: BLE001 - record what transformers refused
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    del main
    torch.cuda.empty_cache()
    return {"batch": len(ids), "new_tokens": new, **out}


def q397(work: str, corpus_path: str) -> dict:
    from probe_gpu_q397 import FULL_LAYERS_397B, LINEAR_LAYERS_397B, build

    path = os.path.join(work, "q397")
    free = shutil.disk_usage(work).free
    per_layer, fixed = 3.9e9, 17.5e9  # NVFP4 layer on disk; BF16 MTP layer + embedding + LM head
    layers = max(4, min(16, int((free - fixed - 6e9) // per_layer) // 4 * 4))
    out = {"disk_free_bytes": free, "layers": layers, "build": build(path, layers)}
    runs = {}
    for name, kw in (("auto", {}), ("host", {"stream_store": "host"})):
        pg.drop_cache(path)
        runs[name] = probe(path, mode="teacher", corpus=corpus_path, steps=3, max_gpu_memory=60.0, **kw)
    out["runs"] = {k: brief(v) for k, v in runs.items()}
    per = runs["auto"]["streaming"]["per_layer"]
    lin = [r["read_s"] + r["compute_s"] for i, r in enumerate(per) if i % 4 != 3]
    full = [r["read_s"] + r["compute_s"] for i, r in enumerate(per) if i % 4 == 3]
    t = runs["auto"]["timings_s"]
    out["per_layer_s"] = {"linear": lin, "full": full}
    out["extrapolated_60_layers_s"] = (t.get("load", 0) + LINEAR_LAYERS_397B * sum(lin) / len(lin)
                                      + FULL_LAYERS_397B * sum(full) / len(full)
                                      + t.get("mtp_chain", 0) + t.get("walk", 0))
    shutil.rmtree(path, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", required=True)
    args = ap.parse_args()
    os.makedirs(pg.WORK, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    import transformers

    RESULTS["env"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                      "gpu": torch.cuda.get_device_name(0) if pg.DEV.startswith("cuda") else pg.DEV, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    ds = os.path.join(pg.WORK, "deepseek2b")
    c65 = pg.corpus_file(2048 if pg.SMALL else 65536)
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            if name == "build":
                RESULTS[name] = pg.build_deepseek(ds)
            elif name == "ceilings":
                RESULTS[name] = pg.ceilings()
            elif name == "hf_mtp":
                RESULTS[name] = pg.hf_mtp(ds, per_category=1)
            elif name == "teacher":
                RESULTS[name] = probe(ds, mode="teacher", corpus=c65, steps=3)
            elif name in ("teacher_b8", "teacher_b32"):
                RESULTS[name] = probe(ds, mode="teacher", corpus=c65, steps=3, batch_size=int(name[9:]))
            elif name == "big_corpus":
                path = corpus(os.path.join(pg.WORK, "big.txt"), 3000 if pg.SMALL else 300_000,
                              (120, 900, 4000, 350, 2200, 60))
                RESULTS[name] = probe(ds, mode="teacher", corpus=path, steps=3)
            elif name == "long_doc":
                n = 1024 if pg.SMALL else 32768
                path = corpus(os.path.join(pg.WORK, "long.txt"), n, (n,))
                RESULTS[name] = probe(ds, mode="teacher", corpus=path, steps=3)
            elif name == "long_equal":
                path = corpus(os.path.join(pg.WORK, "long4k.txt"), 4096, (4096,))
                dense = probe(ds, mode="teacher", corpus=path, steps=3)
                blocked = probe(ds, mode="teacher", corpus=path, steps=3, max_gpu_memory=2.0 if pg.SMALL else 8.0)
                RESULTS[name] = {"dense": dense, "blocked": blocked,
                                 "same_counts": dense["counts"] == blocked["counts"]}
            elif name.startswith("stream_"):
                kw = {"stream_store": "host"} if name != "stream_device" else {"stream_store": "device"}
                if name == "stream_rounds":
                    # a third of the corpus's residual stream (tokens x hidden x 2 bytes): 3 rounds
                    tokens = 2100 if pg.SMALL else 65716
                    os.environ["CKPTINSPECT_PROBE_HOST_MEMORY_LIMIT"] = str(tokens * (256 if pg.SMALL else 2048) * 2 // 3)
                pg.drop_cache(ds)
                try:
                    # under the 5 GB of weights, so the layers stream; 8k-token chunks fit beside a layer
                    RESULTS[name] = brief(probe(ds, mode="teacher", corpus=c65, steps=3, stream_chunk_tokens=8192,
                                                max_gpu_memory=0.25 if pg.SMALL else 4.0, **kw))
                finally:
                    os.environ.pop("CKPTINSPECT_PROBE_HOST_MEMORY_LIMIT", None)
            elif name == "greedy":
                RESULTS[name] = probe(ds, mode="greedy", steps=3, max_new_tokens=256)
            elif name == "greedy_static":
                RESULTS[name] = greedy_static(ds)
            elif name == "synthetic":
                RESULTS[name] = probe(ds, mode="greedy", steps=3, max_new_tokens=128, categories=["chat", "synthetic"])
            elif name == "q397":
                RESULTS[name] = q397(pg.WORK, corpus(os.path.join(pg.WORK, "c110k.txt"), 110_000, (500,)))
        except Exception as exc:  # noqa: BLE001 - a benchmark records what failed and goes on
            import traceback

            RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2500:]}
        RESULTS.setdefault("section_s", {})[name] = time.perf_counter() - t0
        with open(os.path.join(args.out, "probe_gpu_scale.json"), "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)
        print(f"[{name}] {time.perf_counter() - t0:.1f}s {json.dumps(RESULTS[name], default=str)[:700]}", flush=True)


if __name__ == "__main__":
    main()
