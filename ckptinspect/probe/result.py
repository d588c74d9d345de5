"""ProbeResult: the probe's output record (plain data) and how a run's tallies become one: overall rates,
cost model, recommendation, findings. Its JSON and text layout: ckptinspect/render/probe_out.py."""

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
class MainModel:
    source: str  # "in-process transformers", "layer-streamed transformers", or the server URL
    devices: tuple[str, ...]
    dtype: str
    dequantized: bool


@dataclass(frozen=True)
class CostModel:
    """The projected-speedup inputs and table (probe/cost.py), as the run resolved them."""

    gpu: cost.GpuFacts
    efficiency: cost.Efficiency
    weights: cost.ModelCost
    weights_per_gpu_bytes: int
    weights_per_gpu_source: str
    speedup: tuple[Mapping[str, Any], ...]  # rows of cost.speedup_table


@dataclass(frozen=True)
class Streaming:
    """A layer-streamed run (streamed_run.py): what was read and how fast, and its memory bounds."""

    stats: Any  # stream.StreamStats
    estimate_bytes: Mapping[str, int]  # stream.stream_estimate parts and total
    limit_bytes: int
    in_memory_estimate_bytes: int
    peak_bytes: int | None  # CUDA only


@dataclass(frozen=True)
class ProbeResult:
    """One probe run, plain data; its JSON (probe.schema.json) and text are built by
    ckptinspect/render/probe_out.py."""

    model: str
    model_dir: str
    family: str
    model_type: str | None
    mode: str
    steps: int
    temperature: float
    max_new_tokens: int
    main_model: MainModel
    readiness: Mapping[str, Any]
    overall: Tally
    categories: Mapping[str, Tally]
    cost_model: CostModel
    recommendation: Mapping[str, Any]
    elapsed_s: float
    timings_s: Mapping[str, float]
    extra: Mapping[str, Any]  # tokens_scored, memory_estimate_bytes, batch, experts (JSON-ready, route-specific)
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    streaming: Streaming | None = None

    @property
    def alpha1(self) -> float | None:
        return self.overall.conditional()[0] if self.steps else None


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


def _findings(overall: Tally) -> list[Finding]:
    alpha = overall.conditional()[0] if overall.steps else None
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
                 efficiency: cost.Efficiency = cost.DEFAULT_EFFICIENCY, streaming: Streaming | None = None) -> ProbeResult:
    overall = Tally(steps)
    for t in tallies.values():
        overall.merge(t)
    taus = {k: v for k in range(1, steps + 1) if (v := overall.accept_length_from_rates(k)) is not None}
    inventory, config = probe_ckpt.inventory, probe_ckpt.checkpoint.config
    gpu_facts = cost.resolve_gpu(gpu, precision(inventory))
    weights = model_cost(inventory, config)
    table = cost.speedup_table(weights, gpu_facts, taus, eff=efficiency) if taus else []
    from ckptinspect.plan.memory import weights_per_gpu  # the project's one per-GPU memory model

    per_gpu = weights_per_gpu(probe_ckpt.checkpoint, 1, 1, with_mtp=True)
    return ProbeResult(
        model=ref, model_dir=probe_ckpt.checkpoint.location, family=spec.id,
        model_type=config.text_model_type or config.model_type, mode=mode, steps=steps, temperature=temperature,
        max_new_tokens=max_new_tokens,
        main_model=MainModel(main_source, tuple(devices), dtype, dequantized),
        readiness=readiness, overall=overall, categories=dict(sorted(tallies.items())),
        cost_model=CostModel(gpu_facts, efficiency, weights, per_gpu, "ckptinspect.plan.memory, TP 1 / EP 1, MTP loaded",
                             tuple(table)),
        recommendation=recommend(table, steps), elapsed_s=round(time.time() - started, 2),
        timings_s={k: round(v, 3) for k, v in (timings or {}).items()}, extra=dict(extra or {}),
        findings=tuple(_findings(overall)), streaming=streaming)
