"""GPU benchmark of `ckptinspect probe` (issue 12 items 1-4), one H200, one process, one JSON.

Sections (``--sections``, default all but ``q397``), each measured in this run:
  ceilings   bf16 matmul 8192^3 (random data, median of 10), device copy bandwidth, disk read
             bandwidth (8 GiB file, page cache dropped for it with posix_fadvise)
  build      a random DeepSeek-V3-shaped MoE (~2.5B, one MTP layer) written as safetensors
  hf_mtp     transformers generate(..., use_mtp=True), batch 1: verify steps / s (the baseline)
  greedy     probe --mode greedy (24 built-in prompts, 256 new tokens, K=3, one batch)
  teacher    probe --mode teacher on a >= 64k-token corpus, in memory; peak memory vs estimate
  stream     the same corpus layer-streamed (--max-gpu-memory), shards dropped from the page cache:
             read bandwidth vs the disk's; peak memory vs the streamed estimate
  prefill    a plain batched forward with hidden states (32 x 1024): tokens/s and MFU vs the ceiling
  cost       decode forward at batch 1..64 and the K+1 verify step with a KV cache, vs the roofline
             (probe/cost.py) at its default efficiencies and at efficiencies fitted here
  q397       a truncated nvidia/Qwen3.5-397B-A17B-NVFP4 layout (4 full-width layers: 3 linear + 1 full
             attention, NVFP4 routed experts, BF16 MTP layer with 512 experts), layer-streamed teacher
             run on the corpus; extrapolates the 60-layer end-to-end time from the per-layer timings

    python benchmarks/probe_gpu.py --out DIR [--sections a,b,...]
Writes DIR/probe_gpu.json (all numbers) and prints a text summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "fixtures", "probe"))

import torch  # noqa: E402

DEV = os.environ.get("PROBE_BENCH_DEVICE", "cuda:0")  # cpu: a smoke run of the non-timing sections
SMALL = bool(os.environ.get("PROBE_BENCH_SMALL"))  # tiny model for that smoke run
WORK = os.environ.get("PROBE_BENCH_WORK", "/tmp/probe-bench")
RESULTS: dict = {}


def save(out: str) -> None:
    with open(os.path.join(out, "probe_gpu.json"), "w") as fh:
        json.dump(RESULTS, fh, indent=1, default=str)


def cuda_time(fn, reps: int = 10, warm: int = 3) -> float:
    """Median seconds of ``fn`` timed with CUDA events."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def drop_cache(path: str) -> None:
    """Evict a file (or a directory's files) from the page cache, so the next read hits the disk."""
    paths = [os.path.join(path, f) for f in os.listdir(path)] if os.path.isdir(path) else [path]
    for p in paths:
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd) if os.access(p, os.W_OK) else None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def ceilings() -> dict:
    g = torch.Generator(device=DEV).manual_seed(0)
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16, generator=g)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16, generator=g)
    t = cuda_time(lambda: a @ b)
    x = torch.randn(1 << 30, device=DEV, dtype=torch.float32, generator=g)  # 4 GiB
    y = torch.empty_like(x)
    tc = cuda_time(lambda: y.copy_(x))
    del a, b, x, y
    path = os.path.join(WORK, "disk.bin")
    block = os.urandom(64 << 20)
    with open(path, "wb") as fh:
        for _ in range(128):  # 8 GiB
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    drop_cache(path)
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(16 << 20):
            n += len(chunk)
    td = time.perf_counter() - t0
    os.remove(path)
    return {"matmul_bf16_tflops": 2 * 8192 ** 3 / t / 1e12, "copy_gb_s": 2 * (4 << 30) / tc / 1e9,
            "disk_read_gb_s": n / td / 1e9, "disk_bytes": n}


def deepseek_config(tok):
    from transformers import AutoConfig

    width = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_hidden_layers=2,
                 q_lora_rank=64, kv_lora_rank=32) if SMALL else dict(
        hidden_size=2048, intermediate_size=5632, moe_intermediate_size=704, num_hidden_layers=8, q_lora_rank=768,
        kv_lora_rank=256)
    return AutoConfig.for_model(
        "deepseek_v3", vocab_size=32768, **width, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64, n_shared_experts=1,
        num_experts_per_tok=6, n_group=1, topk_group=1, first_k_dense_replace=1,
        qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, max_position_embeddings=4096,
        num_nextn_predict_layers=1, routed_scaling_factor=1.0, norm_topk_prob=True, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        architectures=["DeepseekV3ForCausalLM"])


def build_deepseek(path: str) -> dict:
    import build_fixtures as bf
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from ckptinspect.probe.heads.transformers_mtp import TransformersMtpHead

    t0 = time.perf_counter()
    tok = bf.make_tokenizer()
    cfg = deepseek_config(tok)
    torch.manual_seed(0)
    with torch.device(DEV):
        main = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        head = TransformersMtpHead.fresh(main, family="deepseek_v3")
    main.save_pretrained(path)
    tok.save_pretrained(path)
    extra = {k: v.detach().to("cpu", torch.bfloat16).contiguous()
             for k, v in bf._deepseek_mtp_tensors(head, cfg.num_hidden_layers).items()}
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):  # one file: the MTP layer goes into it (transformers then reads only it)
        from safetensors.torch import load_file

        weights = load_file(single)
        weights.update(extra)
        save_file(weights, single, metadata={"format": "pt"})
        del weights
    else:  # sharded by save_pretrained: one more shard in its index
        save_file(extra, os.path.join(path, "mtp.safetensors"), metadata={"format": "pt"})
        _index_add(path, extra)
    params = sum(p.numel() for p in main.parameters()) + sum(v.numel() for v in extra.values())
    del main, head
    if DEV.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"path": path, "params": params, "build_s": time.perf_counter() - t0}


def _index_add(path: str, extra: dict, shard: str = "mtp.safetensors") -> None:
    idx_path = os.path.join(path, "model.safetensors.index.json")
    idx = json.load(open(idx_path))
    idx["weight_map"].update({k: shard for k in extra})
    json.dump(idx, open(idx_path, "w"))


def corpus_file(min_tokens: int = 65536) -> str:
    import build_fixtures as bf

    path = os.path.join(WORK, "corpus.txt")
    docs, n, i = [], 0, 0
    while n < min_tokens:
        doc = "".join(bf.ANSWERS[(i + j) % len(bf.ANSWERS)] for j in range(9))  # ~500 byte-level tokens
        docs.append(doc)
        n += len(doc)
        i += 1
    open(path, "w").write("\n\n".join(docs))
    return path


def prompts_x4() -> str:
    from ckptinspect.probe.prompts import builtin_prompts

    path = os.path.join(WORK, "prompts96.jsonl")
    lead = ("", "Please answer: ", "Question: ", "Briefly, ")
    with open(path, "w") as fh:
        for pre in lead:
            for p in builtin_prompts():
                fh.write(json.dumps({"category": p.category, "prompt": pre + p.text}) + "\n")
    return path


def hf_mtp(path: str, prompts: int = 4, new: int = 128) -> dict:
    import build_fixtures as bf  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation import candidate_generator as cg

    from ckptinspect.probe.prompts import builtin_prompts, encode_prompt

    tok = AutoTokenizer.from_pretrained(path)
    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEV).eval()
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{main.config.num_hidden_layers}\..*"]
    main.config.name_or_path = path
    steps = [0]
    original = cg.MTPCandidateGenerator.update_candidate_strategy

    def spy(self, input_ids, scores, num_matches):
        steps[0] += 1
        return original(self, input_ids, scores, num_matches)

    cg.MTPCandidateGenerator.update_candidate_strategy = spy
    ids = [encode_prompt(tok, p, chat=True, vocab_size=None, source=path) for p in builtin_prompts()[:prompts + 1]]
    with torch.no_grad():
        main.generate(torch.tensor([ids[0]], device=DEV), do_sample=False, max_new_tokens=16, use_mtp=True,
                      pad_token_id=tok.pad_token_id)  # warm-up (loads the MTP layer)
        steps[0] = 0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p in ids[1:]:
            main.generate(torch.tensor([p], device=DEV), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                          use_mtp=True, pad_token_id=tok.pad_token_id)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    cg.MTPCandidateGenerator.update_candidate_strategy = original
    del main
    torch.cuda.empty_cache()
    return {"verify_steps": steps[0], "seconds": dt, "samples_per_s": steps[0] / dt}


def probe_run(path: str, **kw) -> dict:
    from ckptinspect.probe.runner import run_probe

    cuda = DEV.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(DEV)
    t0 = time.perf_counter()
    result = run_probe(path, device=DEV, progress=False, **kw).to_json()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(DEV) if cuda else 0
    scored = result["overall"]["depths"][0]["scored"]
    timings = result.get("timings_s", {})
    load = timings.get("load", 0.0)
    out = {"wall_s": wall, "scored": scored, "samples_per_s": scored / wall,
           "samples_per_s_after_load": scored / max(wall - load, 1e-9), "timings_s": timings,
           "tokens_scored": result.get("tokens_scored"), "peak_bytes": peak,
           "histogram": result["overall"]["histogram"], "alpha": [d["conditional"] for d in result["overall"]["depths"]],
           "main_source": result["main_model"]["source"]}
    if "streaming" in result:
        out["streaming"] = result["streaming"]
        out["estimate_bytes"] = result["streaming"]["estimate_bytes"]["total"]
    else:
        out["estimate_bytes"] = result["memory_estimate_bytes"]
    out["peak_over_estimate"] = peak / out["estimate_bytes"]
    return out


def active_flops_per_token(path: str) -> tuple[float, object]:
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.result import model_cost

    pc = open_checkpoint(path)
    m = model_cost(pc.inventory, pc.checkpoint.config)
    active = m.dense_params + (m.expert_params * m.top_k / m.num_experts if m.num_experts else m.expert_params)
    return 2.0 * active, m


def prefill(path: str, ceiling_tflops: float) -> dict:
    from transformers import AutoModelForCausalLM

    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEV).eval()
    ids = torch.randint(0, 272, (32, 1024), device=DEV)
    with torch.no_grad():
        t = cuda_time(lambda: main.get_decoder()(input_ids=ids, use_cache=False), reps=5, warm=2)
    flops_tok, _ = active_flops_per_token(path)
    cfg = main.config
    attn = 4 * cfg.num_hidden_layers * 1024 / 2 * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    tokens = ids.numel()
    achieved = tokens * (flops_tok + attn) / t
    del main
    torch.cuda.empty_cache()
    return {"tokens_per_s": tokens / t, "seconds": t, "flops_per_token": flops_tok + attn,
            "achieved_tflops": achieved / 1e12, "mfu_vs_measured_ceiling": achieved / (ceiling_tflops * 1e12)}


def cost_check(path: str, k: int = 3) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    from ckptinspect.probe import cost

    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEV).eval()
    _, m = active_flops_per_token(path)
    gpu = cost.resolve_gpu("H200", "bf16")
    rows = []
    for batch in (1, 2, 4, 8, 16, 32, 64):
        ids = torch.randint(0, 272, (batch, 256), device=DEV)
        with torch.no_grad():
            cache = DynamicCache(config=main.config)
            main(input_ids=ids, past_key_values=cache, use_cache=True)
            base = cache.get_seq_length()

            def step(tokens):
                def fn():
                    main(input_ids=ids[:, :tokens], past_key_values=cache, use_cache=True)
                    cache.crop(base)
                return fn

            t1 = cuda_time(step(1), reps=10, warm=3)
            tv = cuda_time(step(k + 1), reps=10, warm=3)
        p1, pv, _ = cost.step_times(m, gpu, batch, k)
        rows.append({"batch": batch, "measured_target_s": t1, "measured_verify_s": tv, "roofline_target_s": p1,
                     "roofline_verify_s": pv})
    del main
    torch.cuda.empty_cache()
    # Calibration: the efficiencies and per-forward overhead that make the roofline match the
    # measurement best (least squares on log time, grid search), then the error left at each batch.
    import math

    points = [(r["batch"] * t, r[f"measured_{key}_s"]) for r in rows for key, t in (("target", 1), ("verify", k + 1))]
    top = max(t for _, t in points)
    best = None
    for bw in [x / 20 for x in range(1, 21)]:
        for fl in [x / 20 for x in range(1, 21)]:
            for oh in [top * i / 200 for i in range(201)]:
                eff = cost.Efficiency(bw, fl, oh)
                err = sum(math.log(_forward(m, gpu, tokens, eff) / t) ** 2 for tokens, t in points)
                if best is None or err < best[0]:
                    best = (err, eff)
    eff = best[1]
    for r in rows:
        r["calibrated_target_s"] = _forward(m, gpu, r["batch"], eff)
        r["calibrated_verify_s"] = _forward(m, gpu, r["batch"] * (k + 1), eff)
        for key in ("target", "verify"):
            r[f"error_default_{key}"] = r[f"roofline_{key}_s"] / r[f"measured_{key}_s"] - 1
            r[f"error_calibrated_{key}"] = r[f"calibrated_{key}_s"] / r[f"measured_{key}_s"] - 1
    calibration = {"bandwidth_efficiency": eff.bandwidth, "flop_efficiency": eff.flops, "overhead_s": eff.overhead_s,
                   "gpu": torch.cuda.get_device_name(0), "engine": "transformers eager forward (probe's own path)",
                   "date": time.strftime("%Y-%m-%d", time.gmtime())}
    return {"rows": rows, "default": cost.DEFAULT_EFFICIENCY.to_json(), "calibrated": calibration}


def _forward(m, gpu, tokens, eff):
    from ckptinspect.probe import cost

    return cost.forward_time(gpu, m.dense_bytes + m.head_bytes, m.dense_params + m.head_params, m.expert_bytes,
                             m.expert_params, m.num_experts, m.top_k, tokens, eff)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="ceilings,build,hf_mtp,greedy,teacher,stream,prefill,cost")
    args = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    sections = args.sections.split(",")
    RESULTS["env"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if DEV.startswith("cuda") else DEV,
                      "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    import transformers

    RESULTS["env"]["transformers"] = transformers.__version__
    ds = os.path.join(WORK, "deepseek2b")
    corpus = corpus_file(4096 if SMALL else 65536)
    for name in sections:
        t0 = time.perf_counter()
        try:
            if name == "ceilings":
                RESULTS[name] = ceilings()
            elif name == "build":
                RESULTS[name] = build_deepseek(ds)
            elif name == "hf_mtp":
                RESULTS[name] = hf_mtp(ds)
            elif name == "greedy":
                RESULTS[name] = probe_run(ds, mode="greedy", steps=3, max_new_tokens=256, batch_size=24)
            elif name == "greedy96":  # one batch of 96 prompts: the 24 built-ins in 4 phrasings each
                RESULTS[name] = probe_run(ds, mode="greedy", steps=3, max_new_tokens=256, batch_size=96,
                                          prompts=prompts_x4())
            elif name == "teacher":
                RESULTS[name] = probe_run(ds, mode="teacher", corpus=corpus, steps=3, batch_size=32)
            elif name == "stream":
                drop_cache(ds)  # the layers come from the disk, not the page cache
                RESULTS[name] = probe_run(ds, mode="teacher", corpus=corpus, steps=3, batch_size=32,
                                          max_gpu_memory=0.2 if SMALL else 12.5)
            elif name == "prefill":
                RESULTS[name] = prefill(ds, RESULTS.get("ceilings", {}).get("matmul_bf16_tflops", 790.0))
            elif name == "cost":
                RESULTS[name] = cost_check(ds)
                with open(os.path.join(args.out, "cost_calibration.json"), "w") as fh:
                    json.dump(RESULTS[name]["calibrated"], fh, indent=1)
            elif name == "q397":
                from probe_gpu_q397 import run_q397

                RESULTS[name] = run_q397(WORK, corpus, drop_cache, probe_run)
        except Exception as exc:  # noqa: BLE001 - a benchmark records what failed and goes on
            import traceback

            RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        RESULTS.setdefault("section_s", {})[name] = time.perf_counter() - t0
        save(args.out)
        print(f"[{name}] {time.perf_counter() - t0:.1f}s {json.dumps(RESULTS[name], default=str)[:600]}", flush=True)
    summary(args.out)


def summary(out: str) -> None:
    r = RESULTS
    lines = [f"probe GPU benchmark {r['env']}"]
    base = r.get("hf_mtp", {}).get("samples_per_s")
    for name in ("greedy", "greedy96", "teacher", "stream"):
        s = r.get(name, {})
        if "samples_per_s" in s:
            ratio = f" = {s['samples_per_s'] / base:.0f}x transformers" if base else ""
            lines.append(f"{name}: {s['scored']} samples in {s['wall_s']:.1f}s -> {s['samples_per_s']:.0f}/s{ratio}; "
                         f"after load {s['samples_per_s_after_load']:.0f}/s; phases {s['timings_s']}; peak "
                         f"{s['peak_bytes'] / 2**30:.2f} GiB vs estimate {s['estimate_bytes'] / 2**30:.2f} GiB "
                         f"({s['peak_over_estimate']:.2f})")
    text = "\n".join(lines)
    open(os.path.join(out, "probe_gpu.txt"), "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
