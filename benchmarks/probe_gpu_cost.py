"""Sections ``cost`` and ``prefill`` of benchmarks/probe_gpu.py.

``cost``: the decode forward at batch 1..64 and the K+1-token verify step of the same model, timed
on the GPU, against the roofline of ckptinspect/probe/cost.py (default efficiencies, then the
efficiencies and per-forward overhead fitted to these points). Timing: 3 s of forwards first (the
SM clock idles at 345 MHz and ramps up under load; the first points of an earlier run were the
slow ones), then two passes over the points, ascending and descending batch, each point ``WARM``
warm-up forwards and ``REPS`` forwards bracketed by CUDA events; the figure is the median of both
passes' samples, p10 / p90 / min / max the spread, and each pass's own median shows drift (issue 12
item 2: the earlier median of 10 moved by up to 50% between neighbouring batch sizes). Experts:
``grouped_mm`` (one grouped GEMM over the touched experts, each expert's weights read once: the
bytes the roofline counts) for the calibration; ``batched_mm`` (what ``generate`` decodes with on a
GPU; it copies each selected expert's weights per token, so the 64 x 256-token prefill runs with
grouped_mm, as in ``generate``) is measured and fitted the same way as a second section.

``prefill``: a plain batched forward with hidden states, tokens/s and MFU, per experts implementation.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch

REPS, WARM = 100, 10
CLOCK_WARMUP_S = 3.0
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def event_times(fn, reps: int = REPS, warm: int = WARM) -> list[float]:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def spread(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=10)
    return {"median_s": statistics.median(times), "p10_s": q[0], "p90_s": q[-1], "min_s": min(times),
            "max_s": max(times), "n": len(times)}


def _forward(m, gpu, tokens, eff):
    from ckptinspect.probe import cost

    return cost.forward_time(gpu, m.dense_bytes + m.head_bytes, m.dense_params + m.head_params, m.expert_bytes,
                             m.expert_params, m.num_experts, m.top_k, tokens, eff)


def cost_check(path: str, dev: str, model_cost, k: int = 3, experts: str = "grouped_mm") -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    from ckptinspect.probe import cost

    main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, experts_implementation="grouped_mm")
    main = main.to(dev).eval()
    m = model_cost
    gpu = cost.resolve_gpu("H200", "bf16")
    points = {}
    with torch.no_grad():
        for batch in BATCHES:  # prefill every batch's 256-token KV cache once, with grouped_mm
            ids = torch.randint(0, 272, (batch, 256), device=dev)
            cache = DynamicCache(config=main.config)
            main(input_ids=ids, past_key_values=cache, use_cache=True)
            points[batch] = (ids, cache)
        main.set_experts_implementation(experts)

        def step(batch, tokens):
            ids, cache = points[batch]

            def fn():
                main(input_ids=ids[:, :tokens], past_key_values=cache, use_cache=True)
                cache.crop(-tokens)  # back to the 256-token prefix (negative: tokens to drop, 5.17 and 5.24)
            return fn

        end = time.perf_counter() + CLOCK_WARMUP_S
        while time.perf_counter() < end:
            step(BATCHES[-1], k + 1)()
        torch.cuda.synchronize()
        samples: dict[tuple[int, int], list[list[float]]] = {}
        for order in (BATCHES, tuple(reversed(BATCHES))):
            for batch in order:
                for tokens in (1, k + 1):
                    samples.setdefault((batch, tokens), []).append(event_times(step(batch, tokens)))
    assert all(cache.get_seq_length() == 256 for _, cache in points.values()), "crop left the cache off its prefix"
    rows = []
    for batch in BATCHES:
        t1, tv = ({**spread(sum(samples[batch, t], [])), "pass_medians_s": [statistics.median(x) for x in
                                                                          samples[batch, t]]} for t in (1, k + 1))
        p1, pv, _ = cost.step_times(m, gpu, batch, k)
        rows.append({"batch": batch, "measured_target_s": t1["median_s"], "measured_verify_s": tv["median_s"],
                     "target_spread": t1, "verify_spread": tv, "roofline_target_s": p1, "roofline_verify_s": pv})
    impl = main.get_experts_implementation()
    del main
    torch.cuda.empty_cache()
    # Calibration: the efficiencies and per-forward overhead that make the roofline match the
    # measured medians best (least squares on log time, grid search), then the error left at each point.
    points = [(r["batch"] * t, r[f"measured_{key}_s"]) for r in rows for key, t in (("target", 1), ("verify", k + 1))]
    top = max(t for _, t in points)
    best = None
    for bw in [x / 20 for x in range(1, 21)]:
        for fl in [x / 20 for x in range(1, 21)]:
            for oh in [top * i / 400 for i in range(401)]:
                eff = cost.Efficiency(bw, fl, oh)
                err = sum(math.log(_forward(m, gpu, tokens, eff) / t) ** 2 for tokens, t in points)
                if best is None or err < best[0]:
                    best = (err, eff)
    eff = best[1]
    worst = 0.0
    for r in rows:
        r["calibrated_target_s"] = _forward(m, gpu, r["batch"], eff)
        r["calibrated_verify_s"] = _forward(m, gpu, r["batch"] * (k + 1), eff)
        for key in ("target", "verify"):
            r[f"error_default_{key}"] = r[f"roofline_{key}_s"] / r[f"measured_{key}_s"] - 1
            r[f"error_calibrated_{key}"] = r[f"calibrated_{key}_s"] / r[f"measured_{key}_s"] - 1
            worst = max(worst, abs(r[f"error_calibrated_{key}"]))
    calibration = {"bandwidth_efficiency": eff.bandwidth, "flop_efficiency": eff.flops, "overhead_s": eff.overhead_s,
                   "gpu": torch.cuda.get_device_name(0),
                   "engine": f"transformers forward with a KV cache, experts {impl['']}",
                   "date": time.strftime("%Y-%m-%d", time.gmtime())}
    return {"rows": rows, "default": dataclasses.asdict(cost.DEFAULT_EFFICIENCY), "calibrated": calibration,
            "worst_calibrated_error": worst, "within_25pct": sum(abs(r[f"error_calibrated_{key}"]) <= 0.25
                                                                 for r in rows for key in ("target", "verify")),
            "points": 2 * len(rows), "reps": REPS, "warm": WARM, "experts_implementation": impl}


def prefill(path: str, dev: str, ceiling_tflops: float, flops_tok: float) -> dict:
    """Section ``prefill``: a plain batched forward with hidden states (32 x 1024 tokens), tokens/s and
    MFU against the measured bf16 matmul ceiling, once per experts implementation."""
    from transformers import AutoModelForCausalLM

    out = {}
    ids = torch.randint(0, 272, (32, 1024), device=dev)
    for experts in ("grouped_mm", "eager"):
        main = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, experts_implementation=experts)
        main = main.to(dev).eval()
        with torch.no_grad():
            t = spread(event_times(lambda: main.get_decoder()(input_ids=ids, use_cache=False), reps=10, warm=2))
        cfg = main.config
        attn = (4 * cfg.num_hidden_layers * 1024 / 2 * cfg.num_attention_heads
                * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim))
        tokens = ids.numel()
        achieved = tokens * (flops_tok + attn) / t["median_s"]
        del main
        torch.cuda.empty_cache()
        out[experts] = {"tokens_per_s": tokens / t["median_s"], "seconds": t["median_s"], "spread": t,
                        "flops_per_token": flops_tok + attn, "achieved_tflops": achieved / 1e12,
                        "mfu_vs_measured_ceiling": achieved / (ceiling_tflops * 1e12)}
    return out


def cost_summary(r: dict) -> list[str]:
    """The summary lines of the cost sections: fit, points within 25 %, each point's median and p10-p90."""
    lines = []
    for name in ("cost", "cost_batched"):
        c = r.get(name, {})
        if "rows" in c:
            cal = c["calibrated"]
            lines.append(f"{name} ({c['experts_implementation']}): fit bw {cal['bandwidth_efficiency']} fl "
                         f"{cal['flop_efficiency']} overhead {cal['overhead_s'] * 1e3:.2f} ms; {c['within_25pct']}/"
                         f"{c['points']} within 25%, worst {c['worst_calibrated_error']:+.1%}")
            for row in c["rows"]:
                t, v = row["target_spread"], row["verify_spread"]
                lines.append(f"  b{row['batch']:>3}: target {t['median_s'] * 1e3:.2f} ms [{t['p10_s'] * 1e3:.2f}, "
                             f"{t['p90_s'] * 1e3:.2f}] err {row['error_calibrated_target']:+.1%}; verify "
                             f"{v['median_s'] * 1e3:.2f} ms [{v['p10_s'] * 1e3:.2f}, {v['p90_s'] * 1e3:.2f}] "
                             f"err {row['error_calibrated_verify']:+.1%}")
    return lines
