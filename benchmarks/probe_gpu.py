"""GPU benchmark of `ckptinspect probe` (issue 12 items 1-4), one H200, one process, one JSON.

Sections (``--sections``, default all but ``q397``), each measured in this run:
  ceilings   bf16 matmul 8192^3 (random data, median of 10), device copy bandwidth, disk read
             bandwidth (8 GiB file, page cache dropped for it with posix_fadvise)
  build      a random DeepSeek-V3-shaped MoE (~2.5B, one MTP layer) written as safetensors
  hf_mtp     transformers generate(..., use_mtp=True), batch 1 (its only batch), 48 new tokens on 12 of the
             probe's built-in prompts (2 per category): verify steps / s (the baseline), transformers'
             default experts (grouped_mm; batched_mm while decoding on a GPU)
  hf_mtp_eager  the same with experts_implementation="eager" (the per-expert loop)
  greedy     probe --mode greedy, all 144 built-in prompts, 256 new tokens, K=3, default batch (as many
             prompts as the memory estimate fits), transformers' default experts
  greedy_eager  the same with --experts-implementation eager
  greedy_b24 the earlier setting: 24 prompts in one batch of 24
  build_wide, hf_mtp_wide, greedy_wide  the same for a wider shape (hidden 4096, 12 layers, ~10 B params;
             the baseline on 6 prompts x 32 tokens)
  teacher    probe --mode teacher on a >= 64k-token corpus, in memory; peak memory vs estimate
  stream     the same corpus layer-streamed (--max-gpu-memory), shards dropped from the page cache:
             read bandwidth vs the disk's; peak memory vs the streamed estimate
  prefill    a plain batched forward with hidden states (32 x 1024): tokens/s and MFU vs the ceiling,
             grouped_mm and eager experts
  cost       decode forward at batch 1..64 and the K+1 verify step with a KV cache, vs the roofline
             (probe/cost.py) at its default efficiencies and at efficiencies fitted here
             (benchmarks/probe_gpu_cost.py: median of 60 event-timed forwards, with the spread)
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
import shutil
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
    from probe_gpu_cost import event_times

    return statistics.median(event_times(fn, reps=reps, warm=warm))


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


# A wider shape for the greedy sections *_wide (about 10 B params, 20 GB BF16): hidden 4096, 12 layers.
WIDE = dict(hidden_size=4096, intermediate_size=11008, moe_intermediate_size=1024, num_hidden_layers=12,
            q_lora_rank=1536, kv_lora_rank=512, num_attention_heads=32, num_key_value_heads=32)


def deepseek_config(tok, wide: bool = False):
    from transformers import AutoConfig

    width = WIDE if wide else dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_hidden_layers=2,
                                   q_lora_rank=64, kv_lora_rank=32) if SMALL else dict(
        hidden_size=2048, intermediate_size=5632, moe_intermediate_size=704, num_hidden_layers=8, q_lora_rank=768,
        kv_lora_rank=256)
    return AutoConfig.for_model(
        "deepseek_v3", vocab_size=32768, **{"num_attention_heads": 16, "num_key_value_heads": 16, **width},
        n_routed_experts=64, n_shared_experts=1,
        num_experts_per_tok=6, n_group=1, topk_group=1, first_k_dense_replace=1,
        qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, max_position_embeddings=4096,
        num_nextn_predict_layers=1, routed_scaling_factor=1.0, norm_topk_prob=True, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        architectures=["DeepseekV3ForCausalLM"])


def build_deepseek(path: str, wide: bool = False) -> dict:
    import build_fixtures as bf
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from ckptinspect.probe.heads.transformers_mtp import TransformersMtpHead

    t0 = time.perf_counter()
    tok = bf.make_tokenizer()
    cfg = deepseek_config(tok, wide)
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


def baseline_prompts(per_category: int = 2):
    """The first ``per_category`` built-in prompts of each category: the baseline's share of the
    probe's own prompt set (transformers' MTP generate runs one sequence at a time)."""
    from ckptinspect.probe.prompts import builtin_prompts

    seen: dict[str, int] = {}
    out = []
    for p in builtin_prompts():
        if seen.get(p.category, 0) < per_category:
            seen[p.category] = seen.get(p.category, 0) + 1
            out.append(p)
    return out


def hf_mtp(path: str, new: int = 48, experts: str | None = None, per_category: int = 2) -> dict:
    """transformers ``generate(..., use_mtp=True)``, batch 1 (its only batch), greedy, on
    ``baseline_prompts()``; ``experts`` None = transformers' default experts implementation."""
    import build_fixtures as bf  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation import candidate_generator as cg

    from ckptinspect.probe.prompts import encode_prompt

    tok = AutoTokenizer.from_pretrained(path)
    kw = {} if experts is None else {"experts_implementation": experts}
    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw).to(DEV).eval()
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{main.config.num_hidden_layers}\..*"]
    main.config.name_or_path = path
    steps = [0]
    original = cg.MTPCandidateGenerator.update_candidate_strategy

    def spy(self, input_ids, scores, num_matches):
        steps[0] += 1
        return original(self, input_ids, scores, num_matches)

    cg.MTPCandidateGenerator.update_candidate_strategy = spy
    prompts = baseline_prompts(per_category)
    ids = [encode_prompt(tok, p, chat=True, vocab_size=None, source=path) for p in prompts]
    with torch.no_grad():
        main.generate(torch.tensor([ids[0]], device=DEV), do_sample=False, max_new_tokens=16, use_mtp=True,
                      pad_token_id=tok.pad_token_id)  # warm-up (loads the MTP layer)
        steps[0] = 0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p in ids:
            main.generate(torch.tensor([p], device=DEV), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                          use_mtp=True, pad_token_id=tok.pad_token_id)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    cg.MTPCandidateGenerator.update_candidate_strategy = original
    impl = main.get_experts_implementation()
    del main
    torch.cuda.empty_cache()
    return {"verify_steps": steps[0], "seconds": dt, "samples_per_s": steps[0] / dt, "prompts": len(ids),
            "max_new_tokens": new, "batch": 1, "experts_requested": experts or "default",
            "experts_implementation_loaded": impl}


def probe_run(path: str, **kw) -> dict:
    from ckptinspect.probe.runner import run_probe
    from ckptinspect.render.probe_out import probe_json

    cuda = DEV.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(DEV)
    t0 = time.perf_counter()
    result = probe_json(run_probe(path, device=DEV, progress=False, **kw))
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(DEV) if cuda else 0
    if result.get("peak_bytes_by_phase"):  # the probe resets the peak counter at each phase
        peak = max(result["peak_bytes_by_phase"].values())
    scored = result["overall"]["depths"][0]["scored"]
    timings = result.get("timings_s", {})
    load = timings.get("load", 0.0)
    out = {"wall_s": wall, "scored": scored, "samples_per_s": scored / wall,
           "samples_per_s_after_load": scored / max(wall - load, 1e-9), "timings_s": timings,
           "tokens_scored": result.get("tokens_scored"), "peak_bytes": peak,
           "histogram": result["overall"]["histogram"], "alpha": [d["conditional"] for d in result["overall"]["depths"]],
           "main_source": result["main_model"]["source"], "peak_bytes_by_phase": result.get("peak_bytes_by_phase"),
           "batch_size": result.get("batch_size")}
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="ceilings,build,hf_mtp,hf_mtp_eager,greedy,greedy_eager,greedy_b24,teacher,"
                                          "stream,prefill,cost,cost_batched")
    args = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    sections = args.sections.split(",")
    RESULTS["env"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if DEV.startswith("cuda") else DEV,
                      "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    import transformers

    RESULTS["env"]["transformers"] = transformers.__version__
    ds = os.path.join(WORK, "deepseek2b")
    wide_dir = os.path.join(WORK, "deepseek_wide")
    corpus = corpus_file(4096 if SMALL else 65536)
    for name in sections:
        t0 = time.perf_counter()
        try:
            if name == "ceilings":
                RESULTS[name] = ceilings()
            elif name == "build":
                RESULTS[name] = build_deepseek(ds)
            elif name == "build_wide":
                RESULTS[name] = build_deepseek(wide_dir, wide=True)
            elif name == "hf_mtp_wide":  # 6 prompts (one per category) x 32 tokens: a slow baseline
                RESULTS[name] = hf_mtp(wide_dir, new=32, per_category=1)
            elif name == "greedy_wide":
                RESULTS[name] = probe_run(wide_dir, mode="greedy", steps=3, max_new_tokens=256)
            elif name == "hf_mtp":  # transformers' default experts (grouped_mm, batched_mm for decode)
                RESULTS[name] = hf_mtp(ds)
            elif name == "hf_mtp_eager":
                RESULTS[name] = hf_mtp(ds, experts="eager")
            elif name == "greedy":  # every built-in prompt, the default batch (as many as fit)
                RESULTS[name] = probe_run(ds, mode="greedy", steps=3, max_new_tokens=256)
            elif name == "greedy_eager":
                RESULTS[name] = probe_run(ds, mode="greedy", steps=3, max_new_tokens=256, experts_implementation="eager")
            elif name == "greedy_b24":  # the earlier setting: 24 prompts (4 per category) in one batch of 24
                RESULTS[name] = probe_run(ds, mode="greedy", steps=3, max_new_tokens=256, batch_size=24,
                                          max_prompts=24)
            elif name == "teacher":
                RESULTS[name] = probe_run(ds, mode="teacher", corpus=corpus, steps=3, batch_size=32)
            elif name == "stream":
                drop_cache(ds)  # the layers come from the disk, not the page cache
                RESULTS[name] = probe_run(ds, mode="teacher", corpus=corpus, steps=3, batch_size=32,
                                          max_gpu_memory=0.2 if SMALL else 12.5)
            elif name == "prefill":
                from probe_gpu_cost import prefill

                RESULTS[name] = prefill(ds, DEV, RESULTS.get("ceilings", {}).get("matmul_bf16_tflops", 790.0),
                                        active_flops_per_token(ds)[0])
            elif name == "cost":
                from probe_gpu_cost import cost_check

                RESULTS[name] = cost_check(ds, DEV, active_flops_per_token(ds)[1], experts="grouped_mm")
                with open(os.path.join(args.out, "cost_calibration.json"), "w") as fh:
                    json.dump(RESULTS[name]["calibrated"], fh, indent=1)
            elif name == "cost_batched":  # the same with batched_mm, what generate decodes with on a GPU
                from probe_gpu_cost import cost_check

                RESULTS[name] = cost_check(ds, DEV, active_flops_per_token(ds)[1], experts="batched_mm")
            elif name == "q397":
                from probe_gpu_q397 import run_q397

                RESULTS[name] = run_q397(WORK, corpus, drop_cache, probe_run)
                shutil.rmtree(os.path.join(WORK, "q397-trunc"), ignore_errors=True)  # 32.8 GB of a 64 GB disk
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
    for name in ("hf_mtp", "hf_mtp_eager", "hf_mtp_wide"):
        s = r.get(name, {})
        if "samples_per_s" in s:
            lines.append(f"{name}: {s['verify_steps']} verify steps in {s['seconds']:.1f}s -> {s['samples_per_s']:.1f}/s "
                         f"(experts {s['experts_implementation_loaded']})")
    eager = r.get("hf_mtp_eager", {}).get("samples_per_s")
    for name in ("greedy", "greedy_eager", "greedy_b24", "teacher", "stream", "greedy_wide"):
        s = r.get(name, {})
        if "samples_per_s" in s:
            ref = r.get("hf_mtp_wide", {}).get("samples_per_s") if name.endswith("_wide") else base
            ratio = f" = {s['samples_per_s'] / ref:.0f}x transformers" if ref else ""
            ratio += f" ({s['samples_per_s'] / eager:.0f}x its eager-experts run)" if eager and ref is base else ""
            lines.append(f"{name}: {s['scored']} samples in {s['wall_s']:.1f}s -> {s['samples_per_s']:.0f}/s{ratio}; "
                         f"after load {s['samples_per_s_after_load']:.0f}/s; phases {s['timings_s']}; peak "
                         f"{s['peak_bytes'] / 2**30:.2f} GiB vs estimate {s['estimate_bytes'] / 2**30:.2f} GiB "
                         f"({s['peak_over_estimate']:.2f})")
    from probe_gpu_cost import cost_summary

    lines += cost_summary(r)
    text = "\n".join(lines)
    open(os.path.join(out, "probe_gpu.txt"), "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
