"""What the MTP layer costs: parameters, bytes, and its share of each GPU's weight memory (`report --tp/--ep`).

A planner stage: the per-GPU numbers come from the one memory model (plan/memory.py, placements in
rules/engines/common.yaml `memory_model`), the same one `plan` uses, so `report --tp/--ep` and
`plan` agree for the same split. MTP-local ``embed_tokens`` / ``shared_head.head`` copies are
counted as stored but not as loaded: both engines hand the draft the target's embedding and head.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptinspect.errors import PlanError
from ckptinspect.plan.memory import Split, group_bytes_per_rank, split_problem, weight_memory
from ckptinspect.records import Checkpoint, MtpAssessment


@dataclass(frozen=True)
class MtpCost:
    tp: int
    ep: int
    params: int  # logical weight elements of the MTP layer(s)
    bytes: int  # stored bytes of the MTP layer(s)
    loaded_bytes: int  # minus the embedding / head copies the engines share from the target
    expert_bytes: int  # routed-expert part of loaded_bytes
    bytes_per_gpu: int  # MTP bytes one GPU holds
    total_bytes_per_gpu: int  # all weights (target + loaded MTP) one GPU holds
    share_per_gpu: float  # bytes_per_gpu / total_bytes_per_gpu


def split_for(tp: int, ep: int) -> Split:
    """SGLang's split when EP divides TP; EP a multiple of TP is vLLM's data-parallel experts (EP = TP x DP)."""
    if tp >= 1 and ep >= 1 and not split_problem(tp, ep):
        return Split.sglang(tp, ep)
    if tp >= 1 and ep > tp and ep % tp == 0:
        return Split.data_parallel_experts(tp, ep)
    raise PlanError(split_problem(tp, ep) or f"tp and ep must be >= 1 (got tp={tp}, ep={ep})")


def mtp_cost(checkpoint: Checkpoint, mtp: MtpAssessment, tp: int = 1, ep: int = 1) -> MtpCost:
    """Cost of the MTP layer(s) of ``checkpoint`` at tensor-parallel ``tp`` and expert-parallel ``ep``."""
    split = split_for(tp, ep)
    mtp_groups = checkpoint.inventory.mtp_groups()
    placed = [(g, group_bytes_per_rank(checkpoint, g, split)) for g in mtp_groups]
    loaded = [(g, share) for g, (_, kind, share) in placed if kind != "not_loaded"]
    memory = weight_memory(checkpoint, split, with_mtp=True)
    total_gpu = memory.total_bytes_per_rank
    mtp_gpu = memory.mtp_bytes_per_rank
    return MtpCost(
        tp=tp, ep=ep, params=mtp.params, bytes=mtp.bytes, loaded_bytes=sum(g.bytes for g, _ in loaded),
        expert_bytes=sum(g.bytes for g, _ in loaded if g.component == "routed_expert"),
        bytes_per_gpu=mtp_gpu, total_bytes_per_gpu=total_gpu,
        share_per_gpu=(mtp_gpu / total_gpu) if total_gpu else 0.0,
    )
