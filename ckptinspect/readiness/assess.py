"""assess_mtp: the MTP layer of a checkpoint judged per serving engine from the family rule.

Verdict per engine (records.VERDICTS): start from ``ready`` when MTP tensors exist, ``absent``
otherwise; every defect of the engine rule whose condition holds (and whose version range covers
the engine version) lowers the verdict to at most its own and adds a finding. Defects outside the
version range are still reported, as info findings, so users of older engines see them.
"""

from __future__ import annotations

import re
import string
from dataclasses import replace
from typing import Any, Mapping

from ckptinspect.readiness import conditions as _registers  # noqa: F401  (fills the condition registry)
from ckptinspect.readiness.context import EngineContext, Facts, holds
from ckptinspect.readiness.draft_build import build_plan, summary as draft_summary
from ckptinspect.readiness.engine_archs import ARCH_UNKNOWN, arch_support
from ckptinspect.readiness.engine_methods import METHOD_UNKNOWN, support_for
from ckptinspect.readiness.layout import scan_layers
from ckptinspect.readiness.module_table import module_table
from ckptinspect.readiness.model import ENGINES, EngineRule, FamilyRule, RuleSet
from ckptinspect.readiness.quant_method import engine_method
from ckptinspect.inventory.mtp_prefix import concrete_prefix
from ckptinspect.readiness.versions import in_range, representative
from ckptinspect.records import (VERDICT_RANK, Checkpoint, EngineVerdict, Finding, MtpAssessment, MtpLayerInfo)


class _Quiet(dict):
    """Message placeholders without a value stay as written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


_FORMATTER = string.Formatter()


def fill_template(template: str, values: Mapping[str, Any]) -> str:
    """A rule message with its {placeholders} filled in from what the conditions found."""
    try:
        return _FORMATTER.vformat(template, (), _Quiet(values))
    except (ValueError, IndexError, AttributeError):
        return template  # a literal brace the author did not mean as a placeholder


def declared_depth(rule: FamilyRule, checkpoint: Checkpoint) -> tuple[str | None, int | None]:
    """The first depth key present in config.json (dotted paths) and its value; else the first true flag key
    and the rule's default depth."""
    for key in rule.mtp.depth_keys:
        value = checkpoint.config.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            return key, value
    for key in rule.mtp.depth_flag_keys:  # e.g. Parse 3.5: vLLM builds one MTP step when the flag is true
        if checkpoint.config.get(key) is True:
            return key, rule.mtp.depth_default
    return None, None


def build_facts(checkpoint: Checkpoint, family: FamilyRule | None, ruleset: RuleSet) -> Facts:
    from ckptinspect.quant.declared import matcher_for

    rule = family if family is not None else (ruleset.generic or _empty_rule())
    layers = scan_layers(checkpoint.inventory.mtp_groups(), rule.mtp, checkpoint.config)
    key, value = declared_depth(rule, checkpoint)
    return Facts(checkpoint=checkpoint, family=family, rule=rule, layers=layers, declared_key=key,
                 declared_layers=value, engine_method=engine_method(checkpoint.declared),
                 matcher=matcher_for(checkpoint.declared))


def assess_mtp(checkpoint: Checkpoint, family: FamilyRule | None, ruleset: RuleSet, *,
               engine_versions: Mapping[str, str] | None = None) -> MtpAssessment:
    """Judge the checkpoint's MTP layer for every engine of the rule (SGLang and vLLM)."""
    facts = build_facts(checkpoint, family, ruleset)
    base_values = _values(facts)
    findings: list[Finding] = []
    if family is None:
        cfg = checkpoint.config
        findings.append(Finding(
            "unknown-family", "warning",
            f"architecture {cfg.architecture} (model_type {cfg.model_type}) matches no family rule; "
            "MTP scanned with the generic name patterns only",
            hint="add a rule file for it (`ckptinspect rules show FAMILY` prints a model) and pass --rules-dir"))
    probe = EngineContext(facts, _any_engine(facts.rule), "0")
    for check in facts.rule.checks:
        probe.details.clear()
        if holds(check.when, probe):
            findings.append(Finding(check.code, check.severity, fill_template(check.message, {**base_values, **probe.details}),
                                    reference=check.reference, hint=check.remedy,
                                    subject=base_values.get("prefix_hint")))
    verdicts: dict[str, EngineVerdict] = {}
    contexts: dict[str, EngineContext] = {}
    for name in ENGINES:
        engine = facts.rule.engines.get(name)
        if engine is None:
            continue
        version = (engine_versions or {}).get(name, engine.version)
        verdict, engine_findings, contexts[name] = _judge(facts, engine, version, base_values)
        verdicts[name] = verdict
        findings.extend(engine_findings)
    return replace(_assessment(facts, verdicts, findings), modules=module_table(facts, contexts, verdicts))


def _context_at(facts: Facts, engine: EngineRule, version: str) -> EngineContext:
    ctx = EngineContext(facts, engine, version)
    ctx.draft_quant = next((q.result for q in engine.draft_quant if holds(q.when, ctx)), "inherit")
    return ctx


def _judge(facts: Facts, engine: EngineRule, version: str,
           base_values: Mapping[str, Any]) -> tuple[EngineVerdict, list[Finding], EngineContext]:
    ctx = _context_at(facts, engine, version)
    verdict = "ready" if facts.present else "absent"
    reasons: list[str] = []
    findings: list[Finding] = []
    label = engine.engine if engine.engine != "vllm" else "vLLM"
    support = support_for(ctx)
    if support is not None and not support.known:
        # The engine refuses the whole checkpoint before building a module: no per-module answer applies.
        return EngineVerdict(engine=engine.engine, verdict="unusable", engine_version=version,
                             draft_architecture=engine.draft_architecture, method=engine.method,
                             draft_quantization=None, layers_used=0, reasons=(METHOD_UNKNOWN,),
                             module_quantization=()), [Finding(
            METHOD_UNKNOWN, "error", f"quantization method {support.method}: {support.message}",
            engine=engine.engine, reference=support.source,
            hint=f"serve it with an engine that knows {support.method}, or use a quant in a method "
                 f"{label} {version} lists")], ctx
    arch = arch_support(engine.engine, version, facts.checkpoint.config)
    if arch is not None and arch.status == "refused":
        # The engine has no model class for the target at all: it cannot draft for it either (same
        # answer as the plan's missing launch command, ckptinspect/plan/launch.py). An error like
        # engine-has-no-draft-model, which it replaces: a release gate (--fail-on error) still fails.
        # ``absent`` where the checkpoint neither declares nor ships an MTP layer: there is no draft to call
        # unusable, and the error finding says the engine cannot load the target.
        no_mtp = not facts.present and not facts.declared_layers
        return EngineVerdict(engine=engine.engine, verdict="absent" if no_mtp else "unusable",
                             engine_version=version,
                             draft_architecture=engine.draft_architecture, method=engine.method,
                             draft_quantization=None, layers_used=0, reasons=(ARCH_UNKNOWN,),
                             module_quantization=()), [Finding(
            ARCH_UNKNOWN, "error", arch.message, engine=engine.engine, reference=arch.source,
            hint=f"serve it with an engine version that registers {arch.architecture}")], ctx
    if arch is not None and arch.code is not None:
        # Served by another class (the Transformers backend) or not decided: said once, verdict unchanged.
        findings.append(Finding(arch.code, "info", arch.message, engine=engine.engine, reference=arch.source))
    # Modules a firing defect found built with the declared scheme under stricter naming than the
    # plan's default (runtime names: bf16_mtp_not_excluded {names: runtime}).
    built_quantized: set[str] = set()
    for defect in engine.defects:
        current = not defect.versions or in_range(version, defect.versions)
        # A defect of other engine versions is evaluated as that version would see the checkpoint
        # (forced-unquantized modules and draft rules differ by version) and reported as info.
        probe = ctx if current else _context_at(facts, engine, representative(defect.versions or ""))
        probe.details.clear()
        if not holds(defect.when, probe):
            continue
        values = {**base_values, **probe.details, "version": version, "engine": label}
        message = fill_template(defect.message, values)
        remedy = fill_template(defect.remedy, values) if defect.remedy else None
        if not current:
            findings.append(Finding(defect.code, "info", f"[{engine.engine} {defect.versions}] {message}",
                                    engine=engine.engine, reference=defect.reference, hint=remedy))
            continue
        if VERDICT_RANK[defect.verdict] > VERDICT_RANK[verdict]:
            verdict = defect.verdict
        reasons.append(defect.code)
        built_quantized.update(probe.details.get("built_quantized_modules", ()))
        findings.append(Finding(defect.code, defect.severity, message, engine=engine.engine,
                                subject=base_values.get("prefix_hint"), reference=defect.reference, hint=remedy))
    draft_quant, modules = _draft_quantization(ctx)
    if built_quantized and facts.checkpoint.declared.label is not None:
        modules = tuple((m, facts.checkpoint.declared.label if m in built_quantized else b) for m, b in modules)
        draft_quant = facts.checkpoint.declared.label
    if facts.present == 0:
        used = 0
    else:
        used = facts.present if engine.layer_use == "per_step" else 1
    return EngineVerdict(engine=engine.engine, verdict=verdict, engine_version=version,
                         draft_architecture=engine.draft_architecture, method=engine.method,
                         draft_quantization=draft_quant, layers_used=used, reasons=tuple(reasons),
                         module_quantization=modules), findings, ctx


def _draft_quantization(ctx: EngineContext) -> tuple[str | None, tuple[tuple[str, str | None], ...]]:
    """The declared scheme when the engine builds at least one MTP module with it, else None, and
    the per-module answer (draft_build.build_plan). Without MTP tensors there are no modules to ask
    about: the draft-level rule alone says how the engine would build the layer it expects."""
    declared = ctx.facts.checkpoint.declared.label
    if declared is None or ctx.engine.draft_architecture is None:
        return None, ()
    if not ctx.facts.present:
        return (None if ctx.draft_quant == "unquantized" else declared), ()
    plan = build_plan(ctx)
    return (declared if any(m.built_quantized for m in plan) else None), draft_summary(plan)


def _values(facts: Facts) -> dict[str, Any]:
    """Placeholders every message may use."""
    cfg = facts.checkpoint.config
    mtp = facts.rule.mtp
    base = mtp.base if isinstance(mtp.base, str) or mtp.base is None else mtp.base[0]
    hint = concrete_prefix(base, cfg.num_hidden_layers, 0) if base else ""
    first = next(iter(facts.layers.values()), None)
    prefix = first.base if first is not None and first.base else hint
    return {
        "L": cfg.num_hidden_layers, "present": facts.present, "declared": facts.declared_layers,
        "key": facts.declared_key, "keys": ", ".join(mtp.depth_keys) or "none", "default": mtp.depth_default,
        "prefix": prefix or "(generic patterns)", "prefix_hint": prefix or None,
        "exclude_hint": _exclude_hint(facts, prefix), "method": facts.engine_method or "unquantized",
        "family": facts.family.id if facts.family else None,
    }


def _exclude_hint(facts: Facts, prefix: str) -> str:
    """An exclude entry covering the MTP prefix, spelled for the checkpoint's list semantics."""
    if not prefix:
        return "the MTP prefix"
    if any(lst.semantics == "ct_regex" for lst in facts.checkpoint.declared.excludes) or \
            facts.engine_method == "compressed-tensors":
        return "re:" + re.escape(prefix) + ".*"  # compressed-tensors: re.match, else exact names
    return f"{prefix}*"  # ModelOpt / glob lists: fnmatch; the trailing dot keeps layer 3 from matching 30


def _assessment(facts: Facts, verdicts: Mapping[str, EngineVerdict], findings: list[Finding]) -> MtpAssessment:
    infos = []
    schemes: dict[str, int] = {}
    for scan in facts.layers.values():
        layer_schemes: dict[str, int] = {}
        for g in scan.groups:
            layer_schemes[g.scheme] = layer_schemes.get(g.scheme, 0) + g.tensors
            schemes[g.scheme] = schemes.get(g.scheme, 0) + g.tensors
        missing = scan.missing + ((f"{scan.experts_short} routed expert(s)",) if scan.experts_short else ())
        infos.append(MtpLayerInfo(
            k=scan.k, prefix=scan.base,
            tensors=sum(g.tensors for g in scan.groups), params=sum(g.params for g in scan.groups),
            bytes=sum(g.bytes for g in scan.groups), schemes=layer_schemes, missing=missing,
            experts_present=scan.experts_present, experts_expected=scan.experts_expected,
            shards=tuple(sorted(set().union(*(g.shards for g in scan.groups)))),
        ))
    complete = bool(infos) and not any(i.missing for i in infos) and not (
        facts.declared_layers is not None and facts.declared_layers > facts.present)
    return MtpAssessment(
        family=facts.family.id if facts.family else None, declared_key=facts.declared_key,
        declared_layers=facts.declared_layers, present_layers=facts.present,
        tensors=sum(i.tensors for i in infos), params=sum(i.params for i in infos), bytes=sum(i.bytes for i in infos),
        schemes=schemes, complete=complete, layers=tuple(infos), verdicts=dict(verdicts), findings=tuple(findings),
    )


def _any_engine(rule: FamilyRule) -> EngineRule:
    for name in ENGINES:
        if name in rule.engines:
            return rule.engines[name]
    return EngineRule("none", "0", None, None, "reuse_first", None)


def _empty_rule() -> FamilyRule:
    from ckptinspect.readiness.model import MtpLayout

    layout = MtpLayout(True, (), 0, None, (), None, (), (), None, ())
    return FamilyRule("generic", "generic", None, (), (), (), True, None, layout, (), {}, "<none>", 0)
