"""Divisibility checks of a TP / EP size (rules/engines/common.yaml `divisibility`), each one the engine's
own check at the line its rule cites.

Each check names a quantity computed here from the config; the constant it must divide or be a
multiple of comes from the rule (or from the checkpoint's declared FP8 block). Rules whose fix is
`ep` pass once --ep-size = tp removes the expert TP split. A rule of severity `warning` is one where
the engine only logs or pads: it never stops a plan, the plan carries its message.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping

from ckptinspect.plan.rules import PlanFacts, engine_rule_file, engine_rules, holds
from ckptinspect.records import Checkpoint


@dataclass(frozen=True)
class CheckResult:
    id: str
    ok: bool
    message: str  # empty when ok
    fix: str | None  # "ep" when --ep-size = tp fixes it
    source: str
    severity: str = "error"  # "warning": the engine only logs or pads there

    @property
    def blocks(self) -> bool:
        """The engine refuses (or loads wrong) at this size."""
        return not self.ok and self.severity == "error"

    @property
    def warns(self) -> bool:
        return not self.ok and self.severity == "warning"


def _moe_tp(tp: int, ep: int) -> int:
    # SGLang splits each expert over tp / ep ranks (SG:layers/moe: moe_tp_size = tp_size // ep_size).
    return max(tp // ep, 1)


def _per_rank(total: int | None, ranks: int) -> Fraction | None:
    return None if total is None else Fraction(total, ranks)


def gated_experts(ck: Checkpoint) -> bool:
    """Gated (act-and-mul) routed experts: a stored gate projection next to up / down. Nemotron-H's relu2
    experts store only up_proj / down_proj and both engines build them with is_gated=False
    (SG:models/nemotron_h.py:287, VL:model_executor/models/nemotron_h.py NemotronHMoE)."""
    suffixes = {g.module.rsplit(".", 1)[-1] for g in ck.inventory.main_groups() if g.component == "routed_expert"}
    return bool(suffixes & {"gate_proj", "w1", "gate_up_proj", "w13"})


def _gated_per_rank(ck: Checkpoint, tp: int, ep: int) -> Fraction | None:
    return _per_rank(ck.config.moe_intermediate_size, _moe_tp(tp, ep)) if gated_experts(ck) else None


def _scale_columns(ck: Checkpoint, tp: int, ep: int) -> Fraction | None:
    per_rank = _per_rank(ck.config.moe_intermediate_size, _moe_tp(tp, ep))
    return None if per_rank is None else per_rank / 16


QUANTITIES: dict[str, Callable[[Checkpoint, int, int], Fraction | int | None]] = {
    "moe_intermediate": lambda ck, tp, ep: ck.config.moe_intermediate_size,
    "gated_moe_intermediate_per_rank": _gated_per_rank,
    "moe_scale_columns_per_rank": _scale_columns,
    "attention_heads": lambda ck, tp, ep: ck.config.num_attention_heads,
    "kv_heads": lambda ck, tp, ep: ck.config.num_key_value_heads,
    "linear_value_heads": lambda ck, tp, ep: ck.config.text.get("linear_num_value_heads"),
    "routed_experts": lambda ck, tp, ep: ck.config.routed_experts,
    "moe_intermediate_per_rank": lambda ck, tp, ep: _per_rank(ck.config.moe_intermediate_size, _moe_tp(tp, ep)),
    "dense_intermediate_per_rank": lambda ck, tp, ep: (
        _per_rank(ck.config.intermediate_size, tp) if has_dense_mlp(ck) else None),
}


def has_dense_mlp(ck: Checkpoint) -> bool:
    return any(g.component == "mlp" and g.params for g in ck.inventory.main_groups())


def component_quant(ck: Checkpoint, components: tuple[str, ...], default: str) -> str:
    """Quantization kind of the main model's ``components`` from the scheme most of their weight bytes
    carry (rules/engines/common.yaml quant_kinds); ``default`` when they hold no weights."""
    by_scheme: Counter[str] = Counter()
    for g in ck.inventory.main_groups():
        if g.component in components and g.params:
            by_scheme[g.scheme] += g.bytes
    if not by_scheme:
        return default
    scheme = by_scheme.most_common(1)[0][0]
    for kind in engine_rules("common")["quant_kinds"]:
        if scheme in kind["schemes"]:
            return kind["id"]
    return default


def _divisor(rule: Mapping[str, Any], tp: int, ep: int) -> int:
    return {"tp": tp, "ep": ep, "moe_tp": _moe_tp(tp, ep)}[rule.get("divisor", "tp")]


def _multiple(rule: Mapping[str, Any], ck: Checkpoint) -> int | None:
    value = rule.get("multiple_of")
    if value == "block_n":
        block = ck.declared.block_size
        return int(block[0]) if block else None
    return value


def run_checks(ck: Checkpoint, facts: PlanFacts, tp: int, ep: int) -> tuple[CheckResult, ...]:
    """Every applicable divisibility rule for (tp, ep); failed ones carry the rule's message."""
    results = []
    moe_kind = component_quant(ck, ("routed_expert",), facts.quant)
    dense_kind = component_quant(ck, ("mlp",), facts.quant)
    for rule in engine_rules("common")["divisibility"]:
        quantity = rule["quantity"]
        kind = moe_kind if quantity.startswith("moe_") else dense_kind if quantity.startswith("dense_") else facts.quant
        local = PlanFacts(**{**facts.__dict__, "quant": kind})
        if not holds(rule["when"], local, source=engine_rule_file("common")):
            continue
        value = QUANTITIES[quantity](ck, tp, ep)
        if value is None:
            continue
        divisor = _divisor(rule, tp, ep)
        multiple = _multiple(rule, ck)
        if rule["kind"] == "divides":
            ok = value % divisor == 0
        elif rule["kind"] == "heads":
            # KV heads are split when kv >= tp and replicated when tp is a multiple of kv.
            ok = value % divisor == 0 if value >= divisor else divisor % value == 0
        else:
            if multiple is None:
                continue
            ok = Fraction(value).denominator == 1 and int(value) % multiple == 0
        shown = f"{float(value):g}" if isinstance(value, Fraction) else str(value)
        message = "" if ok else rule["message"].format(value=shown, tp=tp, ep=ep, multiple=multiple, divisor=divisor)
        results.append(CheckResult(rule["id"], ok, message, rule["fix"], rule["source"], rule["severity"]))
    return tuple(results)
