"""ProbeResult: the probe's output record, its JSON (probe.schema.json) and text rendering."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ckptinspect.probe import cost
from ckptinspect.probe.heads import HeadSpec
from ckptinspect.probe.metrics import Tally
from ckptinspect.records import Finding

SCHEMA_VERSION = 1
# acceptance_metrics.md §4.5: alpha_1 < 0.05 on chat text = MTP absent / garbage / mis-wired
# (vllm-project/vllm#35548, sgl-project/sglang#35797); 0.05-0.4 = suspect (vllm-project/vllm#43455).
FLOOR_MISSING = 0.05
FLOOR_SUSPECT = 0.40


@dataclass(frozen=True)
class ProbeResult:
    data: Mapping[str, Any]
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.data)
        from ckptinspect.render.findings import finding_json

        out["findings"] = [finding_json(f) for f in self.findings]
        return out

    @property
    def alpha1(self) -> float | None:
        return self.data["overall"]["depths"][0]["conditional"]


def model_cost(inventory, config) -> cost.ModelCost:
    """Weight bytes / params a forward reads, from the report's inventory: its groups already say
    which tensors are MTP (``mtp_layer``), routed experts, embedding, LM head or vision tower."""
    def total(keep) -> tuple[int, int]:
        groups = [g for g in inventory.groups if keep(g)]
        return sum(g.bytes for g in groups), sum(g.params for g in groups)

    def routed(g) -> bool:
        return g.component == "routed_expert"

    def outside_forward(g) -> bool:  # read by no decoder forward: embedding lookup, vision tower
        return g.component in ("embedding", "vision")

    head_b, head_p = total(lambda g: g.mtp_layer is None and g.component == "lm_head")
    if not head_p:  # tied embeddings: the head reads the embedding matrix
        head_b, head_p = total(lambda g: g.mtp_layer is None and g.component == "embedding")
    dense_b, dense_p = total(lambda g: g.mtp_layer is None and not outside_forward(g) and g.component != "lm_head"
                             and not routed(g))
    exp_b, exp_p = total(lambda g: g.mtp_layer is None and routed(g))
    mtp_b, mtp_p = total(lambda g: g.mtp_layer is not None and not outside_forward(g) and g.component != "lm_head"
                         and not routed(g))
    mtp_exp_b, mtp_exp_p = total(lambda g: g.mtp_layer is not None and routed(g))
    experts, top_k = config.routed_experts or 0, config.experts_per_token or 0
    return cost.ModelCost(
        dense_bytes=dense_b, dense_params=dense_p, expert_bytes=exp_b, expert_params=exp_p,
        num_experts=experts if top_k else 0, top_k=top_k, head_bytes=head_b, head_params=head_p,
        mtp_dense_bytes=mtp_b, mtp_dense_params=mtp_p, mtp_expert_bytes=mtp_exp_b, mtp_expert_params=mtp_exp_p)


def precision(inventory) -> str:
    """The narrowest weight format the main model's matmuls run in (what the cost model's peak uses)."""
    schemes = {g.scheme for g in inventory.groups if g.mtp_layer is None}
    if schemes & {"nvfp4", "mxfp4"}:
        return "fp4"
    if schemes & {"fp8_block", "fp8_channel", "fp8_tensor"}:
        return "fp8"
    return "bf16"


def _findings(overall: dict[str, Any]) -> list[Finding]:
    alpha = overall["depths"][0]["conditional"] if overall["depths"] else None
    if alpha is None:
        return [Finding("probe-no-scored-positions", "warning",
                        "no draft position could be scored (prompts too short or continuations ended at once)")]
    if alpha < FLOOR_MISSING:
        return [Finding("mtp-acceptance-floor", "error",
                        f"depth-1 acceptance {alpha:.3f} is under {FLOOR_MISSING}: MTP weights missing or mis-wired",
                        reference="vllm-project/vllm#35548; sgl-project/sglang#35797",
                        hint="check that the MTP tensors were exported from the same base model and left unquantized")]
    if alpha < FLOOR_SUSPECT:
        return [Finding("mtp-acceptance-low", "warning",
                        f"depth-1 acceptance {alpha:.3f} is under {FLOOR_SUSPECT}: suspect MTP precision, "
                        "quantization coverage, remap or graft", reference="vllm-project/vllm#43455")]
    return []


def recommend(table: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Best K at batch 1 (where MTP pays most); plan --probe-report reads these keys."""
    row = table[0] if table else {"best_steps": 0, "best_speedup": None, "by_steps": {}}
    k = row["best_steps"]
    enabled = k > 0
    k = k or 1
    stop = next((r["batch"] for r in table if r["best_steps"] == 0), None)
    return {"enabled": enabled, "num_steps": k, "projected_speedup_bs1": row["by_steps"].get(str(k)),
            "mtp_stops_paying_at_batch": stop,
            "sglang": {"num_steps": k, "eagle_topk": 1, "num_draft_tokens": k + 1},
            "vllm": {"num_speculative_tokens": k}}


def build_result(*, ref: str, probe_ckpt, spec: HeadSpec, mode: str, steps: int,
                 temperature: float, gpu: str, tallies: dict[str, Tally], readiness, devices, dtype: str,
                 started: float, max_new_tokens: int, main_source: str, dequantized: bool,
                 timings: Mapping[str, float] | None = None, extra: Mapping[str, Any] | None = None,
                 efficiency: cost.Efficiency = cost.DEFAULT_EFFICIENCY) -> ProbeResult:
    overall = Tally(steps)
    for t in tallies.values():
        overall.merge(t)
    overall_json = overall.to_json()
    taus = {int(k): v for k, v in overall_json["accept_length_by_steps"].items() if v is not None}
    inventory, config = probe_ckpt.inventory, probe_ckpt.checkpoint.config
    gpu_facts = cost.resolve_gpu(gpu, precision(inventory))
    weights = model_cost(inventory, config)
    table = cost.speedup_table(weights, gpu_facts, taus, eff=efficiency) if taus else []
    from ckptinspect.plan.memory import weights_per_gpu  # the project's one per-GPU memory model

    per_gpu = weights_per_gpu(probe_ckpt.checkpoint, 1, 1, with_mtp=True)
    data = {
        "schema_version": SCHEMA_VERSION,
        "model": ref,
        "model_dir": probe_ckpt.checkpoint.location,
        "family": spec.id,
        "model_type": config.text_model_type or config.model_type,
        "mode": mode,
        "steps": steps,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "main_model": {"source": main_source, "devices": list(devices), "dtype": dtype, "dequantized": dequantized},
        "readiness": readiness,
        "overall": overall_json,
        "categories": {cat: t.to_json() for cat, t in sorted(tallies.items())},
        "cost_model": {"gpu": gpu_facts.name, "gpu_source": gpu_facts.source, "precision": gpu_facts.precision,
                       "bandwidth_efficiency": efficiency.bandwidth, "flop_efficiency": efficiency.flops,
                       "overhead_s": efficiency.overhead_s, "efficiency_source": efficiency.source,
                       "weights": weights.__dict__, "weights_per_gpu_bytes": per_gpu,
                       "weights_per_gpu_source": "ckptinspect.plan.memory, TP 1 / EP 1, MTP loaded",
                       "speedup": table},
        "recommendation": recommend(table, steps),
        "elapsed_s": round(time.time() - started, 2),
        "timings_s": {k: round(v, 3) for k, v in (timings or {}).items()},
        **(extra or {}),
    }
    return ProbeResult(data, tuple(_findings(overall_json)))


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def render_text(result: ProbeResult) -> str:
    d = result.to_json()
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
    for f in d["findings"]:
        lines.append(f"  {f['severity'].upper()}: {f['message']} [{f['code']}]")
    return "\n".join(lines)
