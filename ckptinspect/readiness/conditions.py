"""The structural condition vocabulary of family rule files, registered as kind ``family`` in the one
condition registry (ckptinspect/rules/conditions.py), which evaluates them.

A ``when`` mapping holds condition names (keys) and their arguments; every entry must hold (AND).
``not`` negates a nested mapping, ``any`` is an OR over a list of mappings. Conditions compute their
facts from :class:`Facts` (engine independent, computed once) and :class:`EngineContext` (one engine).
Details a condition finds (missing modules, uncovered names) land in ``ctx.details`` so messages can
quote them.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.inventory.mtp_prefix import concrete_prefix
from ckptinspect.readiness.context import CONDITION_KIND, EngineContext, Facts, holds, listed_sample
from ckptinspect.readiness.draft_build import UNQUANTIZED, build_plan, is_linear_weight
from ckptinspect.readiness.quant_conditions import QUANT_CONDITIONS
from ckptinspect.rules.conditions import register_all

_PARTIAL_COMPONENTS = ("attention", "routed_expert", "mlp")


def _flag(value: bool, arg: Any) -> bool:
    return value if arg is not False else not value


def _declared_but_absent(ctx: EngineContext, arg: Any) -> bool:
    f = ctx.facts
    return _flag(bool(f.declared_layers) and f.present == 0, arg)


def _depth_mismatch(ctx: EngineContext, arg: Any) -> bool:
    f = ctx.facts
    if f.declared_layers is None or f.present == 0 or f.declared_layers == 0:
        return arg is False
    direction = arg.get("declared") if isinstance(arg, Mapping) else None
    if direction == "more":
        hit = f.declared_layers > f.present
    elif direction == "fewer":
        hit = f.declared_layers < f.present
    else:
        hit = f.declared_layers != f.present
    return _flag(hit, arg)


def _missing_required(ctx: EngineContext, arg: Any) -> bool:
    missing = [f"{scan.base}{label}" for scan in ctx.facts.layers.values() for label in scan.missing]
    if missing:
        ctx.details["missing"] = ", ".join(missing)
    return _flag(bool(missing), arg)


def _missing_experts(ctx: EngineContext, arg: Any) -> bool:
    short = [scan for scan in ctx.facts.layers.values() if scan.experts_short > 0]
    if short:
        scan = short[0]
        ctx.details.update(experts_present=scan.experts_present, experts_expected=scan.experts_expected,
                           missing_experts=_ids(scan.missing_experts) or f"{scan.experts_short} expert(s)")
    return _flag(bool(short), arg)


def _ids(ids: tuple[int, ...]) -> str:
    if not ids:
        return ""
    text = ", ".join(str(i) for i in ids[:8])
    return f"ids {text}" + (f" (+{len(ids) - 8} more)" if len(ids) > 8 else "")


def _linear_schemes(ctx: EngineContext) -> dict[str, set[str]]:
    by_component: dict[str, set[str]] = {}
    for g in ctx.facts.mtp_groups():
        if is_linear_weight(g):
            by_component.setdefault(g.component, set()).add(g.scheme)
    return by_component


def _mtp_scheme_is(ctx: EngineContext, arg: Any) -> bool:
    schemes = set().union(*_linear_schemes(ctx).values()) if ctx.facts.present else set()
    hits = sorted(schemes & set(arg))
    if hits:
        ctx.details["mtp_quant_schemes"] = ", ".join(hits)
    return bool(hits)


def _partial_quant(ctx: EngineContext, arg: Any) -> bool:
    by_component = {c: s for c, s in _linear_schemes(ctx).items() if c in _PARTIAL_COMPONENTS}
    flat = set().union(*by_component.values()) if by_component else set()
    hit = bool(flat & UNQUANTIZED) and bool(flat - UNQUANTIZED)
    if hit:
        ctx.details["mtp_component_schemes"] = "; ".join(
            f"{c}: {'/'.join(sorted(s))}" for c, s in sorted(by_component.items()))
    return _flag(hit, arg)


def _declared_method_is(ctx: EngineContext, arg: Any) -> bool:
    return ctx.facts.engine_method in set(arg)


def _quantized_layers_have_prefix(ctx: EngineContext, arg: Any) -> bool:
    layers = ctx.facts.checkpoint.config.num_hidden_layers
    prefix = concrete_prefix(arg, layers, 0)
    return any(name.startswith(prefix) for name in ctx.facts.checkpoint.declared.quantized_layers)


def _excludes_cover(ctx: EngineContext, arg: Any) -> bool:
    scan = ctx.facts.layers.get(0)
    if scan is None:
        return False
    return all(ctx.facts.matcher.is_excluded(scan.base + rel.replace("{k}", "0")) is True for rel in arg)


def uncovered_bf16(ctx: EngineContext, names: str = "either") -> list[str]:
    """Unquantized MTP Linear modules the engine would build with the declared scheme."""
    plan = build_plan(ctx, names)
    return sorted({m.module for m in plan if m.stored in UNQUANTIZED and m.built_quantized})


def _bf16_not_excluded(ctx: EngineContext, arg: Any) -> bool:
    names = _names_arg(arg)
    bad = uncovered_bf16(ctx, names)
    if bad:
        ctx.details["uncovered"] = listed_sample(bad)
        ctx.details["built_quantized_modules"] = tuple(bad)
        # Where the engine's own procedure answered (rules/quant/<engine>.yaml): why it quantizes.
        causes = sorted({f"{m.engine_module}: {c}" for m in build_plan(ctx, names) if m.module in bad
                         for c, b in zip(m.causes, m.built) if c and b is not None})
        ctx.details["build_causes"] = f" ({listed_sample(causes, 2)})" if causes else ""
    return bool(bad)


def _names_arg(arg: Any) -> str:
    return arg.get("names", "either") if isinstance(arg, Mapping) else "either"


def _quantized_built_unquantized(ctx: EngineContext, arg: Any) -> bool:
    """Quantized MTP tensors whose module the engine builds unquantized (per module, for the reasons
    in ``because``; ``modules`` narrows to relative module prefixes)."""
    spec = arg if isinstance(arg, Mapping) else {}
    because = set(spec.get("because", ("undeclared", "draft", "forced", "head", "excluded")))
    wanted = tuple(spec.get("modules", ()))
    hits = []
    for m in build_plan(ctx, _names_arg(arg)):
        if not m.stored_quantized or not any(b is None and r in because for b, r in zip(m.built, m.reasons)):
            continue
        if wanted and not (m.relative is not None and _under(m.relative, wanted, m.k)):
            continue
        hits.append(m)
    if hits:
        ctx.details["built_unquantized"] = listed_sample([m.module for m in hits])
        ctx.details["stored_schemes"] = ", ".join(sorted({m.stored for m in hits}))
        causes = sorted({f"{m.engine_module}: {c}" for m in hits for c, b in zip(m.causes, m.built)
                         if c and b is None})
        ctx.details["build_causes"] = f" ({listed_sample(causes, 2)})" if causes else ""
    return _flag(bool(hits), arg)


def _under(rel: str, wanted: tuple[str, ...], k: int) -> bool:
    for w in wanted:
        w = w.replace("{k}", str(k))
        if rel == w or rel.startswith(w + "."):
            return True
    return False


def _built_scheme_is(ctx: EngineContext, arg: Any) -> bool:
    """Stored schemes of MTP modules the engine builds with the declared scheme."""
    schemes = {m.stored for m in build_plan(ctx) if m.built_quantized}
    hits = sorted(schemes & set(arg))
    if hits:
        ctx.details["mtp_quant_schemes"] = ", ".join(hits)
    return bool(hits)


def mtp_subject(facts: Facts, subject: str | None) -> bool:
    """Whether a finding's subject (a tensor, module or ``N``-masked pattern) lies in an MTP layer."""
    if not subject:
        return False
    return any(scan.base and subject.startswith(scan.base) for scan in facts.layers.values())


def _error_findings(ctx: EngineContext, arg: Any) -> bool:
    """Engine-independent error findings of the checkpoint (quantization cross-check, inventory)
    about MTP tensors; a list argument narrows to those codes."""
    codes = set(arg) if isinstance(arg, list) else None
    hits = [f for f in ctx.facts.checkpoint.findings
            if f.severity == "error" and f.engine is None and (codes is None or f.code in codes)
            and mtp_subject(ctx.facts, f.subject)]
    if hits:
        ctx.details["checkpoint_errors"] = listed_sample([f"{f.code} ({f.subject})" for f in hits], 4)
    return bool(hits) if arg is not False else not hits


def _config_value(ctx: EngineContext, key: str) -> Any:
    """A dotted key of the model config as the report read it (params.json as vLLM adapts it), or None."""
    node: Any = ctx.facts.checkpoint.config.raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _config_is(ctx: EngineContext, arg: Mapping[str, list]) -> bool:
    """Every key set, each to one of its listed values (as text: "rnn", "true", "3")."""
    def text(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)  # JSON's spelling

    return all((value := _config_value(ctx, key)) is not None and text(value) in {str(v) for v in values}
               for key, values in arg.items())


def _config_items_at_least(ctx: EngineContext, arg: Mapping[str, int]) -> bool:
    """Each key holds at least n items: a list's entries, a comma-separated string's (Mistral's per-layer
    patterns and DSpark's target_activation_layers are such strings)."""
    for key, n in arg.items():
        value = _config_value(ctx, key)
        if isinstance(value, str):
            value = [item for item in value.split(",") if item.strip()]
        if not isinstance(value, list) or len(value) < n:
            return False
    return True


def _mtp_lacks(ctx: EngineContext, arg: list) -> bool:
    """MTP tensors ship, but none of a listed module (relative to the rule's base, e.g. a DSpark head that
    only some variants require): a requirement the config decides, where `required` cannot say it."""
    f = ctx.facts
    if not f.layers:
        return False
    base = f.rule.mtp.base if isinstance(f.rule.mtp.base, str) or f.rule.mtp.base is None else f.rule.mtp.base[0]
    prefixes = {concrete_prefix(base or "", f.checkpoint.config.num_hidden_layers, k) for k in f.layers}
    names = {g.pattern for g in f.mtp_groups()}  # tensor-name patterns: a bare parameter is its own module
    lacking = [f"{sorted(prefixes)[0]}{name}" for name in arg
               if not any(n == p + name or n.startswith(p + name + ".") for p in prefixes for n in names)]
    if lacking:
        ctx.details["lacking"] = ", ".join(lacking)
    return bool(lacking)


def _not(ctx: EngineContext, arg: Any) -> bool:
    return not holds(arg, ctx)


def _any(ctx: EngineContext, arg: Any) -> bool:
    return any(holds(item, ctx) for item in arg)


register_all(CONDITION_KIND, {
    "mtp_present": lambda ctx, arg: (ctx.facts.present > 0) == bool(arg),
    "mtp_absent": lambda ctx, arg: _flag(ctx.facts.present == 0, arg),
    "declared_but_absent": _declared_but_absent,
    "present_without_key": lambda ctx, arg: _flag(ctx.facts.present > 0 and ctx.facts.declared_key is None, arg),
    "missing_required": _missing_required,
    "missing_experts": _missing_experts,
    "depth_mismatch": _depth_mismatch,
    "multiple_layers": lambda ctx, arg: _flag(ctx.facts.present > 1, arg),
    "unknown_family": lambda ctx, arg: _flag(ctx.facts.family is None, arg),
    "engine_unsupported": lambda ctx, arg: _flag(ctx.engine.draft_architecture is None, arg),
    # config.json names its own configuration code (auto_map): an engine then reads it with that class (the
    # plan passes --trust-remote-code), else with transformers' own class for the model_type, if any
    "config_remote_code": lambda ctx, arg: _flag(ctx.facts.checkpoint.config.has_remote_code, arg),
    "partial_quant_in_mtp": _partial_quant,
    "declared_quantized": lambda ctx, arg: (ctx.facts.checkpoint.declared.label is not None) == bool(arg),
    "mtp_scheme_is": _mtp_scheme_is,
    "declared_method_is": _declared_method_is,
    "quantized_layers_have_prefix": _quantized_layers_have_prefix,
    "excludes_cover": _excludes_cover,
    "bf16_mtp_not_excluded": _bf16_not_excluded,
    "mtp_quantized_built_unquantized": _quantized_built_unquantized,
    "mtp_built_scheme_is": _built_scheme_is,
    "mtp_error_findings": _error_findings,
    "draft_quant_is": lambda ctx, arg: ctx.draft_quant in set(arg),
    "config_is": _config_is,
    "config_items_at_least": _config_items_at_least,
    "mtp_lacks": _mtp_lacks,
    "not": _not,
    "any": _any,
})
register_all(CONDITION_KIND, QUANT_CONDITIONS)

__all__ = ["EngineContext", "Facts", "holds", "mtp_subject", "uncovered_bf16"]
