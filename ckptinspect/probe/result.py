"""ProbeResult: the probe's output record, its JSON (probe.schema.json) and text rendering."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ckptinspect.probe import cost, loader
from ckptinspect.probe.heads import HeadSpec, text_model_type
from ckptinspect.probe.metrics import Tally

SCHEMA_VERSION = 1
# acceptance_metrics.md §4.5: alpha_1 < 0.05 on chat text = MTP absent / garbage / mis-wired
# (vllm-project/vllm#35548, sgl-project/sglang#35797); 0.05-0.4 = suspect (vllm-project/vllm#43455).
FLOOR_MISSING = 0.05
FLOOR_SUSPECT = 0.40


@dataclass(frozen=True)
class ProbeResult:
    data: Mapping[str, Any]
    findings: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.data)
        out["findings"] = [dict(f) for f in self.findings]
        return out

    @property
    def alpha1(self) -> float | None:
        return self.data["overall"]["depths"][0]["conditional"]


def _model_cost(metas, config: Mapping[str, Any], spec: HeadSpec) -> cost.ModelCost:
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    num_layers = int(text.get("num_hidden_layers", 0))
    mtp_prefix = spec.concrete_prefix(num_layers)
    mtp_markers = ("mtp_", "mtp.", ".mtp_layers.", "mtp_block") if spec.prefix == "model." else (mtp_prefix,)

    def is_mtp(n: str) -> bool:
        return n.startswith(mtp_prefix) and any(m in n for m in mtp_markers) if spec.prefix == "model." else n.startswith(mtp_prefix)

    def routed(n: str) -> bool:
        return ".experts." in n and "shared_expert" not in n

    def skip(n: str) -> bool:
        return "embed_tokens" in n or "shared_head.head" in n or "visual" in n

    head_keep = lambda n: n.startswith("lm_head.")  # noqa: E731
    head_b = loader.stored_bytes(metas, head_keep)
    head_p = loader.logical_params(metas, head_keep)
    if not head_p:  # tied embeddings: the head reads the embedding matrix
        emb = lambda n: n.endswith("embed_tokens.weight") and not is_mtp(n)  # noqa: E731
        head_b, head_p = loader.stored_bytes(metas, emb), loader.logical_params(metas, emb)
    main_dense = lambda n: not is_mtp(n) and not skip(n) and not head_keep(n) and not routed(n)  # noqa: E731
    main_exp = lambda n: not is_mtp(n) and routed(n)  # noqa: E731
    mtp_dense = lambda n: is_mtp(n) and not skip(n) and not routed(n)  # noqa: E731
    mtp_exp = lambda n: is_mtp(n) and routed(n)  # noqa: E731
    experts = int(text.get("n_routed_experts") or text.get("num_experts") or text.get("num_local_experts")
                  or text.get("moe_num_experts") or 0)
    top_k = int(text.get("num_experts_per_tok") or text.get("moe_k") or text.get("top_k") or 0)
    return cost.ModelCost(
        dense_bytes=loader.stored_bytes(metas, main_dense), dense_params=loader.logical_params(metas, main_dense),
        expert_bytes=loader.stored_bytes(metas, main_exp), expert_params=loader.logical_params(metas, main_exp),
        num_experts=experts if top_k else 0, top_k=top_k, head_bytes=head_b, head_params=head_p,
        mtp_dense_bytes=loader.stored_bytes(metas, mtp_dense), mtp_dense_params=loader.logical_params(metas, mtp_dense),
        mtp_expert_bytes=loader.stored_bytes(metas, mtp_exp), mtp_expert_params=loader.logical_params(metas, mtp_exp))


def _precision(metas) -> str:
    kinds = {loader.quant_kind(n, metas) for n in metas}
    if kinds & {"nvfp4", "mxfp4"}:
        return "fp4"
    if kinds & {"fp8_block", "fp8_scaled"}:
        return "fp8"
    return "bf16"


def _findings(overall: dict[str, Any]) -> list[dict[str, Any]]:
    alpha = overall["depths"][0]["conditional"] if overall["depths"] else None
    if alpha is None:
        return [{"code": "probe-no-scored-positions", "severity": "warning",
                 "message": "no draft position could be scored (prompts too short or continuations ended at once)"}]
    if alpha < FLOOR_MISSING:
        return [{"code": "mtp-acceptance-floor", "severity": "error",
                 "message": f"depth-1 acceptance {alpha:.3f} is under {FLOOR_MISSING}: MTP weights missing or mis-wired",
                 "reference": "vllm-project/vllm#35548; sgl-project/sglang#35797",
                 "hint": "check that the MTP tensors were exported from the same base model and left unquantized"}]
    if alpha < FLOOR_SUSPECT:
        return [{"code": "mtp-acceptance-low", "severity": "warning",
                 "message": f"depth-1 acceptance {alpha:.3f} is under {FLOOR_SUSPECT}: suspect MTP precision, "
                            "quantization coverage, remap or graft",
                 "reference": "vllm-project/vllm#43455"}]
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


def build_result(*, ref: str, model_dir: str, config, metas, spec: HeadSpec, mode: str, steps: int,
                 temperature: float, gpu: str, tallies: dict[str, Tally], readiness, devices, dtype: str,
                 started: float, max_new_tokens: int, main_source: str, dequantized: bool) -> ProbeResult:
    overall = Tally(steps)
    for t in tallies.values():
        overall.merge(t)
    overall_json = overall.to_json()
    taus = {int(k): v for k, v in overall_json["accept_length_by_steps"].items() if v is not None}
    gpu_facts = cost.resolve_gpu(gpu, _precision(metas))
    model_cost = _model_cost(metas, config, spec)
    table = cost.speedup_table(model_cost, gpu_facts, taus) if taus else []
    data = {
        "schema_version": SCHEMA_VERSION,
        "model": ref,
        "model_dir": model_dir,
        "family": spec.id,
        "model_type": text_model_type(config),
        "mode": mode,
        "steps": steps,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "main_model": {"source": main_source, "devices": list(devices), "dtype": dtype, "dequantized": dequantized},
        "readiness": readiness,
        "overall": overall_json,
        "categories": {cat: t.to_json() for cat, t in sorted(tallies.items())},
        "cost_model": {"gpu": gpu_facts.name, "gpu_source": gpu_facts.source, "precision": gpu_facts.precision,
                       "bandwidth_efficiency": cost.BW_EFF, "flop_efficiency": cost.FLOP_EFF,
                       "weights": model_cost.__dict__, "speedup": table},
        "recommendation": recommend(table, steps),
        "elapsed_s": round(time.time() - started, 2),
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
        lines += ["", f"  projected speedup on {cm['gpu']} ({cm['precision']}, roofline, {cm['gpu_source']}):"]
        for row in cm["speedup"]:
            lines.append(f"    batch {row['batch']:>4}: " + "  ".join(
                f"K={k} x{v:.2f}" for k, v in row["by_steps"].items()) + f"   best K={row['best_steps']}")
    rec = d["recommendation"]
    lines += ["", f"  recommendation: SGLang --speculative-num-steps {rec['sglang']['num_steps']} "
                  f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {rec['sglang']['num_draft_tokens']}; "
                  f"vLLM num_speculative_tokens={rec['vllm']['num_speculative_tokens']}"
                  + ("" if rec["enabled"] else " (MTP not projected to pay off at batch 1)")]
    for f in d["findings"]:
        lines.append(f"  {f['severity'].upper()}: {f['message']} [{f['code']}]")
    return "\n".join(lines)
