"""Roofline cost of one speculative verify step -> projected speedup vs batch size.

Model (acceptance_metrics.md §4.4, derived): per verify step
    T_step(B, K) = T_target(B * (K + 1) tokens) + K * T_draft(B tokens)
    speedup(B, K) = tau(K) * T_target(B) / T_step(B, K)
Each forward costs max(bytes read / (BW * BW_EFF), FLOPs / (peak * FLOP_EFF)). Bytes read: the
main model's non-expert weights + lm_head + the routed experts the tokens touch (MoE: expected
distinct experts per layer E * (1 - (1 - k/E)^tokens), so verifying K+1 tokens costs more even at
batch 1); the draft reads the MTP layer (+ its touched experts) and the shared lm_head. Weight bytes
are the checkpoint's stored bytes (what an engine serving it reads). Not modelled: KV-cache and
attention cost (grows with context), kernel launch / scheduling overhead, communication under TP/EP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Assumed achievable fractions of datasheet peaks (typical of well-tuned decode kernels; they scale
# both sides of the speedup ratio alike, so they mostly move the batch size where compute dominates).
BW_EFF = 0.80
FLOP_EFF = 0.60

# Fallback GPU constants used only when ckptinspect.plan.gpus (rules/gpus.yaml) is not importable.
# Dense (no sparsity) tensor TFLOPS per precision and HBM bandwidth, NVIDIA datasheets:
# H200 SXM (141 GB HBM3e, 4.8 TB/s), H100 SXM (80 GB, 3.35 TB/s), B200 (180 GB, 8 TB/s), A100 80GB SXM (2.039 TB/s).
FALLBACK_GPUS: dict[str, dict[str, Any]] = {
    "H200": {"memory_gb": 141, "bandwidth_tbs": 4.8, "tflops": {"bf16": 989, "fp8": 1979}},
    "H100": {"memory_gb": 80, "bandwidth_tbs": 3.35, "tflops": {"bf16": 989, "fp8": 1979}},
    "B200": {"memory_gb": 180, "bandwidth_tbs": 8.0, "tflops": {"bf16": 2250, "fp8": 4500, "fp4": 9000}},
    "A100": {"memory_gb": 80, "bandwidth_tbs": 2.039, "tflops": {"bf16": 312}},
}

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class GpuFacts:
    name: str
    bandwidth_bytes_s: float
    flops: float  # at the precision used
    precision: str
    source: str  # "rules/gpus.yaml" or "builtin"


@dataclass(frozen=True)
class ModelCost:
    """Weight bytes / params a forward reads, split so MoE expert sparsity can be modelled."""

    dense_bytes: int  # main model non-expert weights except embedding and lm_head
    dense_params: int
    expert_bytes: int  # all routed experts of all layers
    expert_params: int
    num_experts: int  # routed experts per layer (0 = dense model)
    top_k: int
    head_bytes: int
    head_params: int
    mtp_dense_bytes: int
    mtp_dense_params: int
    mtp_expert_bytes: int
    mtp_expert_params: int


def resolve_gpu(name: str, precision: str) -> GpuFacts:
    """GPU facts from the project catalog (rules/gpus.yaml via ckptinspect.plan.gpus), else the
    builtin table above. Precision falls back fp4 -> fp8 -> bf16 where the GPU lacks it."""
    from ckptinspect.errors import CkptInspectError, ProbeError

    try:
        from ckptinspect.plan.gpus import find_gpu
    except ImportError:
        find_gpu = None
    if find_gpu is not None:
        try:
            spec = find_gpu(name)
        except CkptInspectError as exc:
            raise ProbeError(str(exc)) from exc
        tflops = {"bf16": spec.tflops_bf16, "fp8": spec.tflops_fp8, "fp4": spec.tflops_fp4}
        prec = next(p for p in _fallbacks(precision) if tflops.get(p))
        return GpuFacts(spec.name, float(spec.bandwidth_tbps) * 1e12, float(tflops[prec]) * 1e12, prec,
                        "rules/gpus.yaml")
    key = next((k for k in FALLBACK_GPUS if k.lower() in name.lower().replace("-", "")), None)
    if key is None:
        raise ProbeError(f"unknown GPU {name!r} for the cost model (known: {', '.join(FALLBACK_GPUS)})")
    facts = FALLBACK_GPUS[key]
    prec = next(p for p in _fallbacks(precision) if p in facts["tflops"])
    return GpuFacts(key, facts["bandwidth_tbs"] * 1e12, facts["tflops"][prec] * 1e12, prec, "builtin")


def _fallbacks(precision: str) -> tuple[str, ...]:
    order = ("fp4", "fp8", "bf16")
    return order[order.index(precision):] if precision in order else ("bf16",)


def _touched(num_experts: int, top_k: int, tokens: int) -> float:
    if num_experts <= 0:
        return 1.0
    return 1.0 - (1.0 - top_k / num_experts) ** tokens  # expected fraction of experts hit


def forward_time(gpu: GpuFacts, dense_b: int, dense_p: int, exp_b: int, exp_p: int, e: int, k: int,
                 tokens: int) -> float:
    frac = _touched(e, k, tokens)
    bytes_read = dense_b + exp_b * frac
    active = dense_p + (exp_p * k / e if e else exp_p)
    flops = 2.0 * tokens * active
    return max(bytes_read / (gpu.bandwidth_bytes_s * BW_EFF), flops / (gpu.flops * FLOP_EFF))


def step_times(m: ModelCost, gpu: GpuFacts, batch: int, k: int) -> tuple[float, float, float]:
    """(T_target(batch), T_verify(batch*(k+1)), T_draft(batch)) in seconds."""
    def target(tokens: int) -> float:
        return forward_time(gpu, m.dense_bytes + m.head_bytes, m.dense_params + m.head_params,
                            m.expert_bytes, m.expert_params, m.num_experts, m.top_k, tokens)

    draft = forward_time(gpu, m.mtp_dense_bytes + m.head_bytes, m.mtp_dense_params + m.head_params,
                         m.mtp_expert_bytes, m.mtp_expert_params, m.num_experts, m.top_k, batch)
    return target(batch), target(batch * (k + 1)), draft


def speedup_table(m: ModelCost, gpu: GpuFacts, taus: dict[int, float], batches=DEFAULT_BATCHES) -> list[dict]:
    rows = []
    for b in batches:
        row: dict[str, Any] = {"batch": b, "by_steps": {}}
        for k, tau in sorted(taus.items()):
            t1, tv, td = step_times(m, gpu, b, k)
            row["by_steps"][str(k)] = tau * t1 / (tv + k * td)
        best = max(row["by_steps"].items(), key=lambda kv: kv[1])
        row["best_steps"] = int(best[0]) if best[1] > 1.0 else 0
        row["best_speedup"] = max(best[1], 1.0) if best[1] > 1.0 else best[1]
        rows.append(row)
    return rows
