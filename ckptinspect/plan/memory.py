"""Weight bytes each rank holds for a (tp, ep) split, main model and MTP draft separately.

Expert parallelism moves whole experts instead of slicing them, but every rank still holds
1/tp of the routed-expert bytes (ep ranks x tp/ep slices), so EP changes which shapes must
divide, not the per-rank total. Components listed as replicated are counted whole on each rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ckptinspect.plan.rules import engine_rules
from ckptinspect.records import Checkpoint


@dataclass(frozen=True)
class WeightMemory:
    tp: int
    ep: int
    main_bytes_per_rank: int
    mtp_bytes_per_rank: int  # 0 when the MTP draft is not loaded
    replicated_bytes_per_rank: int  # part of main_bytes_per_rank that every rank holds whole

    @property
    def total_bytes_per_rank(self) -> int:
        return self.main_bytes_per_rank + self.mtp_bytes_per_rank

    def to_json(self, gib: int) -> dict[str, Any]:
        return {
            "tp": self.tp, "ep": self.ep,
            "weights_gib_per_gpu": round(self.main_bytes_per_rank / gib, 2),
            "mtp_gib_per_gpu": round(self.mtp_bytes_per_rank / gib, 2),
            "replicated_gib_per_gpu": round(self.replicated_bytes_per_rank / gib, 2),
        }


def weight_memory(ck: Checkpoint, tp: int, ep: int, *, with_mtp: bool) -> WeightMemory:
    planning = engine_rules("common")["planning"]
    replicated = set(planning["replicated_components"])
    main = mtp = whole = 0
    for g in ck.inventory.groups:
        share = g.bytes if g.component in replicated else -(-g.bytes // tp)
        if g.mtp_layer is not None:
            if with_mtp:
                mtp += share
            continue
        main += share
        if g.component in replicated:
            whole += share
    return WeightMemory(tp, ep, main, mtp, whole)


def mtp_dtypes(ck: Checkpoint) -> dict[str, int]:
    """Scheme -> bytes of the MTP tensors as stored (e.g. {"bf16": ...} for a BF16 draft)."""
    out: Counter[str] = Counter()
    for g in ck.inventory.mtp_groups():
        out[g.scheme] += g.bytes
    return dict(out)
