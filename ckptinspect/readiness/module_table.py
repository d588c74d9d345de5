"""Per MTP weight group, side by side: the declared scheme, the stored scheme, and what each engine
builds (the per-module answers of readiness/draft_build.py), for the report's module table.

The declared column is the declaration read as its exporter meant it (quant/declared.py: exclude /
ignore lists, MIXED_PRECISION ``quantized_layers``); the engine columns are what each engine's own
procedure makes of it, so a difference between the two is where an engine reads the declaration its
own way (e.g. SGLang's FP8 config reads no ``ignore`` key: rules/quant/sglang.yaml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ckptinspect.readiness.draft_build import ModuleBuild, build_plan, rule_at
from ckptinspect.readiness.engine_archs import arch_support
from ckptinspect.readiness.engine_methods import support_for
from ckptinspect.readiness.module_quant import module_quant_rules
from ckptinspect.records import EngineVerdict, MtpModuleQuant

if TYPE_CHECKING:
    from ckptinspect.readiness.context import EngineContext, Facts


def module_table(facts: "Facts", contexts: Mapping[str, "EngineContext"],
                 verdicts: Mapping[str, EngineVerdict]) -> tuple[MtpModuleQuant, ...]:
    """One row per MTP Linear / head weight group (empty without MTP tensors). Where a defect found
    a module built quantized under the engine's runtime names only (assess.py ``built_quantized``),
    the verdict's per-module answer wins, so the table and the verdict agree."""
    if not facts.present:
        return ()
    plans = {name: {m.module: m for m in build_plan(ctx)} for name, ctx in contexts.items()
             if ctx.engine.draft_architecture is not None}
    order = next(iter(plans.values()), None)
    if order is None:  # no engine has a draft model: the rows still show declared vs stored
        any_ctx = next(iter(contexts.values()), None)
        if any_ctx is None:
            return ()
        order = {m.module: m for m in build_plan(any_ctx)}
    # An engine that does not know the declared method refuses the checkpoint: it builds no module.
    refused = {name: support.message for name, ctx in contexts.items()
               if (support := support_for(ctx)) is not None and not support.known}
    # An engine with no model class for the target (readiness/engine_archs.py) builds none either.
    no_class = {name: arch.message for name, ctx in contexts.items() if name not in refused
                and (arch := arch_support(ctx.engine.engine, ctx.version, ctx.facts.checkpoint.config)) is not None
                and arch.status == "refused"}
    rows = []
    for module, first in order.items():
        built, reasons, causes, matches = {}, {}, {}, {}
        for name in contexts:
            m = plans.get(name, {}).get(module)
            if name in refused:
                built[name], reasons[name], causes[name], matches[name] = "not buildable", "method_unknown", \
                    refused[name], False
                continue
            if m is None:
                built[name], reasons[name], causes[name], matches[name] = "no draft model", "-", "", True
                continue
            if name in no_class:  # a draft class exists, but the engine cannot load the target it drafts for
                built[name], reasons[name], causes[name], matches[name] = "not buildable", "arch_unknown", \
                    no_class[name], False
                continue
            built[name], reasons[name], causes[name], matches[name] = _engine_cell(m)
            undecided = _not_decided(contexts[name], m)
            if undecided:
                built[name] = f"{built[name]} (not decided)"
                causes[name] = undecided
            final = dict(verdicts[name].module_quantization).get(module) if name in verdicts else None
            if final is not None and not m.built_quantized:
                built[name], reasons[name], matches[name] = final, "quantized", m.stored_quantized
                causes[name] = "the engine matches the lists on its runtime module name, which no entry covers"
        rows.append(MtpModuleQuant(module=module, component=first.component, declared=_declared(facts, module),
                                   stored=_stored(first), built=built, reasons=reasons, causes=causes,
                                   matches=matches))
    return tuple(rows)


def _not_decided(ctx: "EngineContext", m: ModuleBuild) -> str:
    """Why the cell is the generic reading of the declared lists rather than the engine's own procedure
    ("" when the engine's procedure, its model code or its draft rule decided)."""
    if set(m.reasons) - {"excluded", "quantized"} or any(m.causes):
        return ""
    method = ctx.facts.engine_method
    if rule_at(module_quant_rules(ctx.engine.engine), method, ctx.version) is not None:
        return ""
    return (f"not decided by {ctx.engine.engine} {ctx.version}'s own reading: rules/quant/{ctx.engine.engine}.yaml "
            f"models no {method} entry at this version, so the declared lists are read as their exporter meant them")


def _engine_cell(m: ModuleBuild) -> tuple[str, str, str, bool]:
    labels = sorted({b or "unquantized" for b in m.built})
    if "load_error" in m.reasons:
        text = "load error"
    elif len(labels) == 1:
        text = labels[0]
    else:
        quantized = sum(b is not None for b in m.built)
        text = f"{'/'.join(labels)} ({quantized} of {len(m.built)} asked quantized)"
    reasons = "/".join(sorted(set(m.reasons)))
    causes = "; ".join(sorted({c for c in m.causes if c}))[:300]
    fits = "load_error" not in m.reasons and not m.unlike_stored()
    return text, reasons, causes, fits


def _stored(m: ModuleBuild) -> str:
    """The stored scheme; where members are stored in other schemes too, how many and which (the members
    the engine columns are checked against one by one)."""
    if not m.stored_each:
        return m.stored
    others: dict[str, list[str]] = {}
    for name, scheme in m.stored_each:
        if scheme != m.stored:
            others.setdefault(scheme, []).append(name)
    parts = [f"{len(names)} of {len(m.stored_each)} members {scheme}: {', '.join(names[:2])}"
             + (f" and {len(names) - 2} more" if len(names) > 2 else "") for scheme, names in sorted(others.items())]
    return f"{m.stored} ({'; '.join(parts)})"


def _declared(facts: "Facts", module: str) -> str:
    declared = facts.checkpoint.declared
    if declared.label is None:
        return "none"
    name = module.replace("{}", "0")
    if declared.quantized_layers:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            algo = declared.quantized_layers.get(".".join(parts[:end]))
            if algo is not None:
                return algo
    return "excluded" if facts.is_excluded(name) else ("unlisted" if declared.quantized_layers else declared.label)
