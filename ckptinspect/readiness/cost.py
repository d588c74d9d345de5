"""What the MTP layer costs: parameters, bytes, and its share of each GPU's weight memory.

Sharding model (the engines' defaults for MoE checkpoints): routed experts are split by EP, every
other Linear / embedding by TP, norms, routers and other 1-D tensors are replicated. MTP-local
``embed_tokens`` / ``shared_head.head`` copies are counted as stored but not as loaded, because both
engines share the target's embedding and head with the draft (mtp_families.md §5.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ckptinspect.errors import PlanError
from ckptinspect.records import Checkpoint, MtpAssessment, TensorGroup

_REPLICATED = frozenset({"norm", "router"})
_SHARED_WITH_TARGET = frozenset({"embedding", "lm_head"})


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

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "ep": self.ep, "params": self.params, "bytes": self.bytes,
                "loaded_bytes": self.loaded_bytes, "expert_bytes": self.expert_bytes,
                "bytes_per_gpu": self.bytes_per_gpu, "total_bytes_per_gpu": self.total_bytes_per_gpu,
                "share_per_gpu": round(self.share_per_gpu, 6)}


def _per_gpu(groups: Iterable[TensorGroup], tp: int, ep: int) -> int:
    total = 0
    for g in groups:
        if g.component in _REPLICATED or len(g.shape) < 2:
            total += g.bytes
        elif g.component == "routed_expert":
            total += -(-g.bytes // ep)
        else:
            total += -(-g.bytes // tp)
    return total


def mtp_cost(checkpoint: Checkpoint, mtp: MtpAssessment, tp: int = 1, ep: int = 1) -> MtpCost:
    """Cost of the MTP layer(s) of ``checkpoint`` at tensor-parallel ``tp`` and expert-parallel ``ep``."""
    if tp < 1 or ep < 1:
        raise PlanError(f"tp and ep must be >= 1 (got tp={tp}, ep={ep})")
    inventory = checkpoint.inventory
    mtp_groups = inventory.mtp_groups()
    loaded = [g for g in mtp_groups if g.component not in _SHARED_WITH_TARGET]
    mtp_gpu = _per_gpu(loaded, tp, ep)
    total_gpu = _per_gpu(inventory.main_groups(), tp, ep) + mtp_gpu
    return MtpCost(
        tp=tp, ep=ep, params=mtp.params, bytes=mtp.bytes, loaded_bytes=sum(g.bytes for g in loaded),
        expert_bytes=sum(g.bytes for g in loaded if g.component == "routed_expert"),
        bytes_per_gpu=mtp_gpu, total_bytes_per_gpu=total_gpu,
        share_per_gpu=(mtp_gpu / total_gpu) if total_gpu else 0.0,
    )
