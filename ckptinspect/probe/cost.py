"""Roofline cost of one speculative verify step -> projected speedup vs batch size.

Model (acceptance_metrics.md §4.4, derived): per verify step
    T_step(B, K) = T_target(B * (K + 1) tokens) + K * T_draft(B tokens)
    speedup(B, K) = tau(K) * T_target(B) / T_step(B, K)
Each forward costs max(bytes read / (BW * BW_EFF), FLOPs / (peak * FLOP_EFF)). Bytes read: the
main model's non-expert weights + lm_head + the routed experts the tokens touch (MoE: expected
distinct experts per layer E * (1 - (1 - k/E)^tokens), so verifying K+1 tokens costs more even at
batch 1); the draft reads the MTP layer (+ its touched experts) and the shared lm_head. Weight bytes
are the checkpoint's stored bytes (what an engine serving it reads). ``Efficiency`` holds the
fractions of peak and a fixed per-forward overhead (launches, framework, scheduling): the defaults
are assumptions, a file written by benchmarks/probe_gpu.py (measured forwards on that GPU) replaces
them, and the result says which it used. Not modelled: KV-cache and attention cost (grows with
context), communication under TP/EP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Assumed achievable fractions of datasheet peaks (typical of well-tuned decode kernels; they scale
# both sides of the speedup ratio alike, so they mostly move the batch size where compute dominates).
BW_EFF = 0.80
FLOP_EFF = 0.60

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Efficiency:
    bandwidth: float = BW_EFF
    flops: float = FLOP_EFF
    overhead_s: float = 0.0  # added to every forward
    source: str = "assumed defaults"


DEFAULT_EFFICIENCY = Efficiency()
MAX_CALIBRATION_BYTES = 1024 * 1024  # a calibration file is a few hundred bytes


def load_efficiency(path: str) -> Efficiency:
    """A calibration file: {"bandwidth_efficiency", "flop_efficiency", "overhead_s", "gpu", ...}."""
    import math

    from ckptinspect.errors import ProbeError
    from ckptinspect.guarded_file import read_json

    # The guarded reader: a FIFO or /dev/zero is one error line, not a hang or a full memory.
    data = read_json(path, what="cost calibration", cap=MAX_CALIBRATION_BYTES, error=ProbeError)
    values = []
    for name, default in (("bandwidth_efficiency", None), ("flop_efficiency", None), ("overhead_s", 0.0)):
        value = data.get(name, default) if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProbeError(f"not a cost calibration file ({name!r} is not a number)", path=path)
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        values.append(value)
    eff = Efficiency(values[0], values[1], values[2], f"calibrated: {path}")
    if not (0 < eff.bandwidth <= 1 and 0 < eff.flops <= 1 and 0 <= eff.overhead_s < 3600):
        raise ProbeError("cost calibration out of range (efficiencies in (0, 1], overhead in [0, 3600) s)", path=path)
    return eff


@dataclass(frozen=True)
class GpuFacts:
    name: str
    bandwidth_bytes_s: float
    flops: float  # at the precision used
    precision: str
    source: str  # where the figures came from ("rules/gpus.yaml")


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


def resolve_gpu(name: Any, precision: str) -> GpuFacts:
    """GPU facts from the project catalog (rules/gpus.yaml, through ckptinspect.plan.gpus), the same
    entries `plan` uses. Precision falls back fp4 -> fp8 -> bf16 where the GPU lacks it."""
    from ckptinspect.errors import CkptInspectError, ProbeError
    from ckptinspect.plan.gpus import find_gpu

    try:
        spec = find_gpu(name)
    except CkptInspectError as exc:
        raise ProbeError(str(exc)) from None
    tflops = {"bf16": spec.tflops_bf16, "fp8": spec.tflops_fp8, "fp4": spec.tflops_fp4}
    prec = next((p for p in _fallbacks(precision) if tflops.get(p)), None)
    if prec is None:
        raise ProbeError(f"rules/gpus.yaml gives {spec.name} no TFLOPS for {precision} or any wider format")
    return GpuFacts(spec.name, float(spec.bandwidth_tbps) * 1e12, float(tflops[prec]) * 1e12, prec,
                    spec.spec_file or "rules/gpus.yaml")


def _fallbacks(precision: str) -> tuple[str, ...]:
    order = ("fp4", "fp8", "bf16")
    return order[order.index(precision):] if precision in order else ("bf16",)


def _touched(num_experts: int, top_k: int, tokens: int) -> float:
    if num_experts <= 0:
        return 1.0
    return 1.0 - (1.0 - top_k / num_experts) ** tokens  # expected fraction of experts hit


def forward_time(gpu: GpuFacts, dense_b: int, dense_p: int, exp_b: int, exp_p: int, e: int, k: int,
                 tokens: int, eff: Efficiency = DEFAULT_EFFICIENCY) -> float:
    frac = _touched(e, k, tokens)
    bytes_read = dense_b + exp_b * frac
    active = dense_p + (exp_p * k / e if e else exp_p)
    flops = 2.0 * tokens * active
    return max(bytes_read / (gpu.bandwidth_bytes_s * eff.bandwidth), flops / (gpu.flops * eff.flops)) + eff.overhead_s


def step_times(m: ModelCost, gpu: GpuFacts, batch: int, k: int,
               eff: Efficiency = DEFAULT_EFFICIENCY) -> tuple[float, float, float]:
    """(T_target(batch), T_verify(batch*(k+1)), T_draft(batch)) in seconds."""
    def target(tokens: int) -> float:
        return forward_time(gpu, m.dense_bytes + m.head_bytes, m.dense_params + m.head_params,
                            m.expert_bytes, m.expert_params, m.num_experts, m.top_k, tokens, eff)

    draft = forward_time(gpu, m.mtp_dense_bytes + m.head_bytes, m.mtp_dense_params + m.head_params,
                         m.mtp_expert_bytes, m.mtp_expert_params, m.num_experts, m.top_k, batch, eff)
    return target(batch), target(batch * (k + 1)), draft


def speedup_table(m: ModelCost, gpu: GpuFacts, taus: dict[int, float], batches=DEFAULT_BATCHES,
                  eff: Efficiency = DEFAULT_EFFICIENCY) -> list[dict]:
    rows = []
    for b in batches:
        row: dict[str, Any] = {"batch": b, "by_steps": {}}
        for k, tau in sorted(taus.items()):
            t1, tv, td = step_times(m, gpu, b, k, eff)
            row["by_steps"][str(k)] = tau * t1 / (tv + k * td)
        best = max(row["by_steps"].items(), key=lambda kv: kv[1])
        row["best_steps"] = int(best[0]) if best[1] > 1.0 else 0
        row["best_speedup"] = max(best[1], 1.0) if best[1] > 1.0 else best[1]
        rows.append(row)
    return rows
