"""The one per-GPU weight memory model: `report --tp/--ep`, `plan` and the probe's cost model call it.

Where each stored tensor group lives for a parallel split is data: rules/engines/common.yaml
`memory_model.placements` (first match wins), e.g. norms and routers replicated, embedding / LM head
vocab-parallel (vocab padded, then divided over the attention TP ranks), routed experts whole per
EP rank and sliced over MoE-TP, KV projections replicated once TP exceeds the KV heads, MLA
down-projections replicated, and the MTP layer's own embedding / head copies not loaded because the
engines hand the draft the target's. This module registers the placement conditions and
applies those rules.

    split = Split.sglang(tp=8, ep=8)
    weight_memory(checkpoint, split, with_mtp=True).total_bytes_per_rank
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import PlanError
from ckptinspect.plan.rules import engine_rules
from ckptinspect.records import Checkpoint, TensorGroup
from ckptinspect.rules.conditions import evaluate, register_all


@dataclass(frozen=True)
class Split:
    """How a job spreads over GPUs: attention TP ranks, and the MoE-TP x MoE-EP grid of the experts.

    SGLang: world = --tp-size, attention TP = tp, expert grid = (tp / ep) x ep
    (SG:runtime_context.py derive_parallel_widths: moe_tp_size = tp_size // moe_ep_size).
    vLLM with data-parallel attention: attention TP = tp, experts over EP = TP x DP ranks, unsliced.
    """

    attn_tp: int
    moe_tp: int
    moe_ep: int

    @property
    def world(self) -> int:
        return self.moe_tp * self.moe_ep

    @property
    def tp(self) -> int:
        return self.attn_tp

    @property
    def ep(self) -> int:
        return self.moe_ep

    @classmethod
    def sglang(cls, tp: int, ep: int = 1) -> "Split":
        problem = split_problem(tp, ep)
        if problem:
            raise PlanError(problem)
        return cls(tp, tp // ep, ep)

    @classmethod
    def data_parallel_experts(cls, tp: int, ep: int) -> "Split":
        """vLLM's EP = TP x DP: attention TP `tp` in each of ep / tp replicas, whole experts per rank."""
        if tp < 1 or ep < tp or ep % tp:
            raise PlanError(f"EP {ep} is not TP {tp} x a data-parallel size (vLLM: EP size = TP x DP)")
        return cls(tp, 1, ep)


def split_problem(tp: int, ep: int | None) -> str:
    """Why SGLang / vLLM refuse `--tp tp --ep ep`, or "" when both accept it."""
    if tp < 1 or (ep is not None and ep < 1):
        return f"tp and ep must be >= 1 (got tp={tp}, ep={ep})"
    if ep is None or ep == 1:
        return ""
    rule = engine_rules("common")["memory_model"]["ep_rule"]
    if ep > tp or tp % ep:
        return rule["message"].format(tp=tp, ep=ep) + f" [{rule['source']}]"
    return ""


@dataclass(frozen=True)
class WeightMemory:
    tp: int
    ep: int
    main_bytes_per_rank: int
    mtp_bytes_per_rank: int  # 0 when the MTP draft is not loaded
    replicated_bytes_per_rank: int  # part of main_bytes_per_rank that every rank holds whole
    by_placement: Mapping[str, int]  # placement id -> bytes per rank (main + loaded MTP)

    @property
    def total_bytes_per_rank(self) -> int:
        return self.main_bytes_per_rank + self.mtp_bytes_per_rank


def _suffix(group: TensorGroup) -> str:
    return group.module.rsplit(".", 1)[-1] if group.module else ""


# Placement conditions (kind ``placement`` of the one registry, ckptinspect/rules/conditions.py): over
# one stored tensor group.
PLACEMENT_KIND = "placement"
register_all(PLACEMENT_KIND, {
    "mtp": lambda group, want: (group.mtp_layer is not None) == want,
    "component": lambda group, want: group.component in want,
    "module_suffix": lambda group, want: _suffix(group) in want,
    "max_ndim": lambda group, want: len(group.shape) <= want,
})
_PLACEMENT_SOURCE = "rules/engines/common.yaml memory_model.placements"


def placement_of(group: TensorGroup) -> Mapping[str, Any]:
    """The first `memory_model.placements` rule that matches ``group`` (the last one matches all)."""
    for rule in engine_rules("common")["memory_model"]["placements"]:
        if evaluate(rule["when"], group, PLACEMENT_KIND, source=_PLACEMENT_SOURCE):
            return rule
    raise PlanError(f"no memory placement rule matches {group.pattern} (rules/engines/common.yaml memory_model)")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _vocab_share(ck: Checkpoint, nbytes: int, tp: int) -> int:
    vocab = ck.config.vocab_size
    if not vocab:
        return _ceil(nbytes, tp)
    pad = engine_rules("common")["memory_model"]["vocab_padding"]
    padded = _ceil(vocab, pad) * pad
    # Each rank holds padded / tp rows of the stored row size.
    return _ceil(nbytes * padded, vocab * tp)


def _kv_head_share(ck: Checkpoint, nbytes: int, tp: int) -> int:
    kv = ck.config.num_key_value_heads or ck.config.num_attention_heads
    if not kv:
        return _ceil(nbytes, tp)
    heads = _ceil(kv, tp) if kv >= tp else 1  # replicated (one head per rank) once tp > kv
    return _ceil(nbytes * heads, kv)


def group_bytes_per_rank(ck: Checkpoint, group: TensorGroup, split: Split) -> tuple[str, str, int]:
    """(placement id, split kind, bytes one rank holds) for one tensor group."""
    rule = placement_of(group)
    kind, nbytes = rule["split"], group.bytes
    if kind == "not_loaded":
        share = 0
    elif kind == "replicated":
        share = nbytes
    elif kind == "vocab":
        share = _vocab_share(ck, nbytes, split.attn_tp)
    elif kind == "experts":
        share = _ceil(nbytes, split.moe_ep * split.moe_tp)
    elif kind == "kv_heads":
        share = _kv_head_share(ck, nbytes, split.attn_tp)
    elif kind == "tp":
        share = _ceil(nbytes, split.attn_tp)
    else:
        raise PlanError(f"unknown memory split {kind!r} in rule {rule['id']} (rules/engines/common.yaml)")
    return rule["id"], kind, share


def weight_memory(ck: Checkpoint, split: Split, *, with_mtp: bool) -> WeightMemory:
    """Weight bytes one GPU holds under ``split``; the MTP draft counted only when ``with_mtp``."""
    main = mtp = whole = 0
    by: Counter[str] = Counter()
    for g in ck.inventory.groups:
        rule_id, kind, share = group_bytes_per_rank(ck, g, split)
        if g.mtp_layer is not None:
            if with_mtp:
                mtp += share
                by[rule_id] += share
            continue
        main += share
        by[rule_id] += share
        if kind == "replicated":
            whole += share
    return WeightMemory(split.attn_tp, split.moe_ep, main, mtp, whole, dict(by))


def weights_per_gpu(ck: Checkpoint, tp: int, ep: int = 1, *, with_mtp: bool = True) -> int:
    """Bytes of weights one GPU holds at SGLang's `--tp-size tp --ep-size ep` (for the probe's cost model)."""
    return weight_memory(ck, Split.sglang(tp, ep), with_mtp=with_mtp).total_bytes_per_rank


def mtp_dtypes(ck: Checkpoint) -> dict[str, int]:
    """Scheme -> bytes of the MTP tensors as stored (e.g. {"bf16": ...} for a BF16 draft)."""
    out: Counter[str] = Counter()
    for g in ck.inventory.mtp_groups():
        out[g.scheme] += g.bytes
    return dict(out)
