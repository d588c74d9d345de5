"""The condition vocabulary of rule files, evaluated by generic code.

A ``when`` mapping holds condition names (keys) and their arguments; every entry must hold (AND).
``not`` negates a nested mapping, ``any`` is an OR over a list of mappings. Conditions compute their
facts from :class:`Facts` (engine independent, computed once) and :class:`EngineContext` (one engine).
Details a condition finds (missing modules, uncovered names) land in ``ctx.details`` so messages can
quote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ckptinspect.readiness.layout import LayerScan
from ckptinspect.readiness.model import EngineRule, FamilyRule
from ckptinspect.inventory.mtp_prefix import concrete_prefix
from ckptinspect.readiness.versions import in_range
from ckptinspect.records import Checkpoint, TensorGroup

UNQUANTIZED = frozenset({"bf16", "fp16", "fp32"})
# Components an engine never builds as a quantized Linear from the global scheme: routers are
# ReplicatedLinear(quant_config=None) in both engines, norms are not Linear, embeddings / shared
# heads are shared from the target (mtp_families.md §5.3).
_NOT_LINEAR = frozenset({"norm", "embedding", "lm_head", "router", "vision"})
_PARTIAL_COMPONENTS = ("attention", "routed_expert", "mlp")


def is_linear_weight(g: TensorGroup) -> bool:
    """A stored Linear weight (2-D or grouped 3-D), not a companion, bias or norm."""
    return (g.role in ("weight", "other") and len(g.shape) >= 2 and g.component not in _NOT_LINEAR)


@dataclass
class Facts:
    """Engine-independent facts of one checkpoint under one family rule."""

    checkpoint: Checkpoint
    family: FamilyRule | None  # None: unknown architecture
    rule: FamilyRule  # the family, or the generic rule for unknown ones
    layers: Mapping[int, LayerScan]
    declared_key: str | None
    declared_layers: int | None
    engine_method: str | None  # quantization method name as the engines call it
    matcher: Any  # ckptinspect.quant.declared.ExcludeMatcher

    @property
    def present(self) -> int:
        return len(self.layers)

    def mtp_groups(self) -> list[TensorGroup]:
        return [g for scan in self.layers.values() for g in scan.groups]


@dataclass
class EngineContext:
    facts: Facts
    engine: EngineRule
    version: str
    draft_quant: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    _uncovered: dict[str, list[str]] = field(default_factory=dict)


def evaluate(when: Mapping[str, Any] | None, ctx: EngineContext) -> bool:
    """True when every condition of ``when`` holds (an absent ``when`` always holds)."""
    if not when:
        return True
    for name, arg in when.items():
        if not CONDITIONS[name](ctx, arg):
            return False
    return True


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


def _forced(ctx: EngineContext) -> list[str]:
    out: list[str] = []
    for entry in ctx.engine.forced_unquantized:
        if (entry.versions is None or in_range(ctx.version, entry.versions)) and evaluate(entry.when, ctx):
            out.extend(entry.modules)
    return out


def _runtime_names(ctx: EngineContext, name: str, k: int) -> list[str]:
    layers = ctx.facts.checkpoint.config.num_hidden_layers
    out = []
    for rn in ctx.engine.runtime_names:
        source = concrete_prefix(rn.source, layers, k)
        if name.startswith(source):
            out.append(concrete_prefix(rn.target, layers, k) + name[len(source):])
    return out


def uncovered_bf16(ctx: EngineContext, names: str = "either") -> list[str]:
    """Unquantized MTP Linear modules the declared lists would let the engine quantize."""
    if names in ctx._uncovered:
        return ctx._uncovered[names]
    facts = ctx.facts
    out: list[str] = []
    if facts.checkpoint.declared.label is not None:
        forced = _forced(ctx)
        for scan in facts.layers.values():
            for g in scan.groups:
                if not is_linear_weight(g) or g.scheme not in UNQUANTIZED:
                    continue
                modules = _sample_modules(g)
                rel = scan.relative(modules[0])
                if rel is not None and any(rel == m or rel.startswith(m + ".") for m in forced):
                    continue
                bad = [n for n in modules if not _covered(ctx, n, scan.k, names)]
                if bad:
                    out.append(g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module)
    ctx._uncovered[names] = sorted(set(out))
    return ctx._uncovered[names]


def _sample_modules(g: TensorGroup) -> list[str]:
    """First, middle and last member's module name: exporters summarise excludes per layer prefix,
    so one group (e.g. all experts of a layer) is covered or not as a whole; three probes keep this
    O(groups) even for 256-expert MTP layers."""
    subs = sorted(g.sub_indices) or [()]
    picks = sorted({subs[0], subs[len(subs) // 2], subs[-1]})
    slots = g.module.count("{}")
    out = []
    for sub in picks:
        values = ([g.index] if g.index is not None else []) + list(sub)
        out.append(g.module.format(*values[:slots]) if slots else g.module)
    return out


def _covered(ctx: EngineContext, name: str, k: int, names: str) -> bool:
    matcher = ctx.facts.matcher
    ckpt = matcher.is_excluded(name) is not False
    runtime = [matcher.is_excluded(r) is not False for r in _runtime_names(ctx, name, k)]
    rt = all(runtime) if runtime else ckpt
    if names == "checkpoint":
        return ckpt
    if names == "runtime":
        return rt
    return ckpt or rt


def _bf16_not_excluded(ctx: EngineContext, arg: Any) -> bool:
    names = arg.get("names", "either") if isinstance(arg, Mapping) else "either"
    bad = uncovered_bf16(ctx, names)
    if bad:
        ctx.details["uncovered"] = ", ".join(bad[:6]) + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else "")
    return bool(bad)


def _not(ctx: EngineContext, arg: Any) -> bool:
    return not evaluate(arg, ctx)


def _any(ctx: EngineContext, arg: Any) -> bool:
    return any(evaluate(item, ctx) for item in arg)


CONDITIONS: dict[str, Callable[[EngineContext, Any], bool]] = {
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
    "partial_quant_in_mtp": _partial_quant,
    "declared_quantized": lambda ctx, arg: (ctx.facts.checkpoint.declared.label is not None) == bool(arg),
    "mtp_scheme_is": _mtp_scheme_is,
    "declared_method_is": _declared_method_is,
    "quantized_layers_have_prefix": _quantized_layers_have_prefix,
    "excludes_cover": _excludes_cover,
    "bf16_mtp_not_excluded": _bf16_not_excluded,
    "draft_quant_is": lambda ctx, arg: ctx.draft_quant in set(arg),
    "not": _not,
    "any": _any,
}
