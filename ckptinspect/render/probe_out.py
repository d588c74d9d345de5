"""`probe` output: the JSON document (ckptinspect/probe/probe.schema.json) and the terminal text of a
``probe.result.ProbeResult``. The records stay plain data; every key and line layout is decided here.

Imports no torch (tests/test_probe_batching.py checks it): rendering is no part of the measurement.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ckptinspect.render.findings import finding_json
from ckptinspect.render.terminal import wrap_text

SCHEMA_VERSION = 1


def _wilson(successes: int, trials: int):
    from ckptinspect.probe.metrics import wilson  # pure Python, no torch

    return wilson(successes, trials)


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def tally_json(tally: Any) -> dict[str, Any]:
    """One ``metrics.Tally`` (all sequences, or one category)."""
    steps, accepted = tally.verify_steps(), tally.accepted_drafts()
    depths = []
    for j, d in enumerate(tally.depth, start=1):
        walk_cond, walk_uncond = tally.walk_rates(j)
        depths.append({
            "k": j,
            "conditional": _ratio(d.accepted, d.reached),
            "conditional_ci95": _wilson(d.accepted, d.reached),
            "unconditional": _ratio(d.accepted, d.total),
            "unconditional_ci95": _wilson(d.accepted, d.total),
            "reached": d.reached, "accepted": d.accepted, "scored": d.total,
            "walk_conditional": walk_cond,
            "walk_unconditional": walk_uncond,
            "sampled_acceptance": (d.min_pq_sum / d.min_pq_n) if d.min_pq_n else None,
        })
    return {
        "sequences": tally.sequences,
        "generated_tokens": tally.generated_tokens,
        "verify_steps": steps,
        "accepted_drafts": accepted,
        "histogram": list(tally.histogram),
        "accept_length_sglang": tally.accept_length_sglang(),
        "accept_length_vllm": tally.accept_length_vllm(),
        "mean_accepted": (accepted / steps) if steps else None,
        "accept_rate": (accepted / (steps * tally.steps)) if steps else None,
        "accept_length_by_steps": {str(k): tally.accept_length_from_rates(k) for k in range(1, tally.steps + 1)},
        "depths": depths,
    }


def _throughput(result: Any) -> dict[str, Any]:
    """Teacher mode against its ceiling: the main model's own forward over the scored tokens (its
    prefill, timed in this run as ``hidden_forward``) against the whole scoring (forward + MTP chain
    + walk); ``fraction_of_prefill`` 1.0 would be a probe as fast as the model's prefill alone."""
    t = result.timings_s
    tokens = result.extra.get("tokens_scored")
    forward = t.get("hidden_forward", 0.0)
    if result.mode != "teacher" or not tokens or forward <= 0:
        return {}
    scoring = forward + t.get("mtp_chain", 0.0) + t.get("walk", 0.0)
    return {"throughput": {"tokens_scored": tokens, "prefill_tokens_per_s": round(tokens / forward, 1),
                           "probe_tokens_per_s": round(tokens / scoring, 1),
                           "fraction_of_prefill": round(forward / scoring, 4),
                           "chain_parts_s": {k[len("chain_"):]: round(v, 4) for k, v in t.items()
                                             if k.startswith("chain_")}}}


def _overlap(per_layer: list[dict[str, float]]) -> dict[str, float | None]:
    """How well the layer reads hid behind the compute, over the layers after the first (whose read
    has nothing to overlap): the median of each layer's wall time over its read time (1.0: the disk
    alone set the pace) and the share of the read time the main thread did not wait for."""
    rows = per_layer[1:] or per_layer
    ratios = sorted(r["wall_s"] / r["read_s"] for r in rows if r.get("read_s") and "wall_s" in r)
    read = sum(r.get("read_s", 0.0) for r in rows)
    waited = sum(r.get("wait_s", 0.0) for r in rows)
    return {"wall_over_read_median": round(ratios[len(ratios) // 2], 3) if ratios else None,
            "read_hidden_fraction": round(max(0.0, read - waited) / read, 3) if read else None}


def stream_json(streaming: Any) -> dict[str, Any]:
    """The ``streaming`` object of a layer-streamed run (``probe.result.Streaming``)."""
    st = streaming.stats
    out = {"layers": st.layers, "bytes_read": st.bytes_read, "read_s": round(st.read_s, 3),
           "load_s": round(st.load_s, 3), "compute_s": round(st.compute_s, 3), "wall_s": round(st.wall_s, 3),
           "chunk_tokens": st.chunk_tokens,
           **({"piece_tokens": st.piece_tokens} if getattr(st, "piece_tokens", None) else {}),
           "read_ahead": st.overlapped,
           "load_ahead": getattr(st, "load_ahead", False), "overlap": _overlap(st.per_layer),
           "max_layer_bytes": st.max_layer_bytes,
           "read_bandwidth_gb_s": round(st.bytes_read / st.read_s / 1e9, 3) if st.read_s else None,
           "per_layer": [{k: round(v, 4) for k, v in row.items()} for row in st.per_layer],
           "store": st.store, "rounds": st.rounds, "store_bytes_moved": st.store_bytes_moved,
           "estimate_bytes": dict(streaming.estimate_bytes), "limit_bytes": streaming.limit_bytes,
           "in_memory_estimate_bytes": streaming.in_memory_estimate_bytes}
    if streaming.peak_bytes is not None:
        out["peak_bytes"] = streaming.peak_bytes
    return out


def probe_json(result: Any) -> dict[str, Any]:
    """The `probe --format json` document (keys of schema_version 1 are stable)."""
    cm, eff = result.cost_model, result.cost_model.efficiency
    return {
        "schema_version": SCHEMA_VERSION,
        "model": result.model,
        "model_dir": result.model_dir,
        "family": result.family,
        "model_type": result.model_type,
        "mode": result.mode,
        "steps": result.steps,
        "temperature": result.temperature,
        "max_new_tokens": result.max_new_tokens,
        "main_model": {"source": result.main_model.source, "devices": list(result.main_model.devices),
                       "dtype": result.main_model.dtype, "dequantized": result.main_model.dequantized},
        "readiness": result.readiness,
        "overall": tally_json(result.overall),
        "categories": {cat: tally_json(t) for cat, t in result.categories.items()},
        "cost_model": {"gpu": cm.gpu.name, "gpu_source": cm.gpu.source, "precision": cm.gpu.precision,
                       "bandwidth_efficiency": eff.bandwidth, "flop_efficiency": eff.flops,
                       "overhead_s": eff.overhead_s, "efficiency_source": eff.source,
                       "weights": asdict(cm.weights), "weights_per_gpu_bytes": cm.weights_per_gpu_bytes,
                       "weights_per_gpu_source": cm.weights_per_gpu_source,
                       "speedup": [dict(row) for row in cm.speedup]},
        "recommendation": result.recommendation,
        "elapsed_s": result.elapsed_s,
        "timings_s": dict(result.timings_s),
        **_throughput(result),
        **result.extra,
        **({"streaming": stream_json(result.streaming)} if result.streaming is not None else {}),
        "findings": [finding_json(f) for f in result.findings],
    }


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def probe_text(result: Any) -> str:
    """The terminal layout (unwrapped)."""
    d = probe_json(result)
    o = d["overall"]
    lines = [f"MTP draft-acceptance probe: {d['model']} ({d['family']}, mode {d['mode']}, K={d['steps']}, "
             f"T={d['temperature']})",
             f"  main model: {d['main_model']['source']} on {', '.join(d['main_model']['devices'])} "
             f"({d['main_model']['dtype']}{', dequantized on load' if d['main_model']['dequantized'] else ''})",
             f"  sequences {o['sequences']}, generated tokens {o['generated_tokens']}, verify steps {o['verify_steps']}",
             "",
             "  depth  cond.accept  95% CI           uncond.  walk-cond  sum-min(p,q)  scored"]
    for r in o["depths"]:
        ci = r["conditional_ci95"]
        ci_s = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"
        lines.append(f"  {r['k']:>5}  {_fmt(r['conditional']):>11}  {ci_s:<15}  {_fmt(r['unconditional']):>7}  "
                     f"{_fmt(r['walk_conditional']):>9}  {_fmt(r['sampled_acceptance']):>12}  {r['reached']:>6}")
    lines += ["",
              f"  accept length (SGLang, tokens/verify step incl. bonus): {_fmt(o['accept_length_sglang'])}; "
              f"vLLM mean acceptance length: {_fmt(o['accept_length_vllm'])}",
              f"  accepted drafts per verify step (histogram n=0..K): {o['histogram']}",
              "  accept length by K (from conditional rates): "
              + ", ".join(f"K={k}: {_fmt(v, 2)}" for k, v in o["accept_length_by_steps"].items())]
    if d["categories"]:
        lines.append("  per category (depth-1 acceptance / accept length): " + "; ".join(
            f"{c}: {_fmt(v['depths'][0]['conditional'])} / {_fmt(v['accept_length_sglang'], 2)}"
            for c, v in d["categories"].items()))
    cm = d["cost_model"]
    if cm["speedup"]:
        lines += ["", f"  projected speedup on {cm['gpu']} ({cm['precision']}, roofline, {cm['gpu_source']}; "
                      f"efficiencies {cm['efficiency_source']}):"]
        for row in cm["speedup"]:
            lines.append(f"    batch {row['batch']:>4}: " + "  ".join(
                f"K={k} x{v:.2f}" for k, v in row["by_steps"].items()) + f"   best K={row['best_steps']}")
    rec = d["recommendation"]
    lines += ["", f"  recommendation: SGLang --speculative-num-steps {rec['sglang']['num_steps']} "
                  f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {rec['sglang']['num_draft_tokens']}; "
                  f"vLLM num_speculative_tokens={rec['vllm']['num_speculative_tokens']}"
                  + ("" if rec["enabled"] else " (MTP not projected to pay off at batch 1)")]
    if d.get("timings_s"):
        lines.append("  timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in d["timings_s"].items())
                     + f"; total {d['elapsed_s']:.2f}")
    if "batch_size" in d:
        lines.append(f"  batch size {d['batch_size']} ({d['batch_size_source']})")
    experts = d.get("experts_implementation")
    if experts:
        lines.append(f"  MoE experts (transformers, requested {experts['requested']}): forward {experts['forward'] or '-'}, "
                     f"decode {experts['decode'] or '-'}")
    for f in d["findings"]:
        lines.append(f"  {f['severity'].upper()}: {f['message']} [{f['code']}]")
    return "\n".join(lines)


def render_probe(result: Any, fmt: str, *, width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps(probe_json(result), indent=2)
    from ckptinspect.escape import escape_controls

    # escaped line by line: the probe's own text has newlines, its values (paths, prompts) must not
    return wrap_text("\n".join(escape_controls(line) for line in probe_text(result).split("\n")), width)

