"""Divisibility checks that make a TP / EP size fail at load (rules/engines/common.yaml `divisibility`).

Each check names a quantity computed here from the config; the constant it must divide or be a
multiple of comes from the rule (or from the checkpoint's declared FP8 block). Rules whose fix is
`ep` pass once --ep-size = tp removes the expert TP split.
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


def _moe_tp(tp: int, ep: int) -> int:
    # SGLang splits each expert over tp / ep ranks (SG:layers/moe: moe_tp_size = tp_size // ep_size).
    return max(tp // ep, 1)


def _per_rank(total: int | None, ranks: int) -> Fraction | None:
    return None if total is None else Fraction(total, ranks)


QUANTITIES: dict[str, Callable[[Checkpoint, int, int], Fraction | int | None]] = {
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
    return tp if rule.get("divisor", "tp") == "tp" else ep


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
        message = "" if ok else rule["message"].format(value=shown, tp=tp, ep=ep, multiple=multiple)
        results.append(CheckResult(rule["id"], ok, message, rule["fix"], rule["source"]))
    return tuple(results)
