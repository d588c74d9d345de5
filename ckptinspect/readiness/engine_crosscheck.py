"""The checkpoint's "quantized but listed as excluded" findings, answered by each engine's own reading.

quant/crosscheck.py reads every declared list the way ModelOpt globs read (any list, any key). Engines do
not: an FP8 config reads ``ignored_layers`` / ``modules_to_not_convert`` only, so an ``ignore`` entry naming
an FP8 Linear leaves it FP8, as stored (SG:layers/quantization/fp8.py Fp8Config.from_config; the nvidia
DeepSeek-V4 NVFP4 exports list their FP8 attention and shared experts there). Here each such module is
asked again through the engine's decision procedure for the declared method (quant/engine_decision.py,
rules/quant/<engine>.yaml), at the engine version the report answers for:

- every engine that models the method builds it quantized -> no error: an info finding says which
  list names it and that the engines do not read that list for it;
- some engine builds it unquantized (or refuses) -> the error, for that engine only when they differ;
- an engine that does not model the method is "not decided": the generic reading stays, for it.

The result replaces the crosscheck's findings before the MTP verdicts read them, so the verdict, the
per-module table and the checkpoint findings come from one answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ckptinspect.quant.detect import UNQUANTIZED
from ckptinspect.quant.engine_decision import QUANTIZED, UNKNOWN, decide
from ckptinspect.quant.members import weighted_members
from ckptinspect.readiness.draft_build import engine_module, rule_at
from ckptinspect.readiness.model import ENGINES, FamilyRule, RuleSet
from ckptinspect.readiness.module_quant import module_quant_rules
from ckptinspect.readiness.quant_method import engine_method
from ckptinspect.records import Checkpoint, Finding, TensorGroup

CODE = "quantized-but-excluded"
_LABEL = {"sglang": "SGLang", "vllm": "vLLM"}


def _key(g: TensorGroup) -> str:
    return g.module.replace("{}", "N")


def reconcile_crosscheck(checkpoint: Checkpoint, family: FamilyRule | None, ruleset: RuleSet,
                         engine_versions: Mapping[str, str] | None = None) -> Checkpoint:
    """``checkpoint`` with its quantized-but-excluded findings replaced by the engines' own answers."""
    if not any(f.code == CODE for f in checkpoint.findings):
        return checkpoint
    rule = family if family is not None else ruleset.generic
    declared = checkpoint.declared
    method = engine_method(declared)
    # (engine, version, rules/quant section, method entry) for every engine the family rule knows
    engines = []
    for name in ENGINES:
        engine = rule.engines.get(name) if rule is not None else None
        if engine is None:
            continue
        version = (engine_versions or {}).get(name, engine.version)
        section = module_quant_rules(name)
        engines.append((name, version, section, rule_at(section, method, version)))
    groups: dict[str, list[TensorGroup]] = {}
    for g in checkpoint.inventory.groups:
        if g.role == "weight" and len(g.shape) >= 2 and g.scheme not in UNQUANTIZED and g.scheme != "other":
            groups.setdefault(_key(g), []).append(g)
    out: list[Finding] = []
    not_read: list[tuple[str, Finding, str]] = []  # (pattern, finding, engines' source) built as stored
    for finding in checkpoint.findings:
        if finding.code != CODE:
            out.append(finding)
            continue
        key = finding.message.split(":", 1)[0]
        kept, source = _answer(finding, key, groups.get(key, []), engines, declared, method)
        out.extend(kept)
        if source:
            not_read.append((key, finding, source))
    if not_read:
        keys = [k for k, _, _ in not_read]
        lists = ", ".join(lst.source for lst in declared.excludes if lst.semantics != "include_map")
        names = " and ".join(f"{_LABEL[n]} {v}" for n, v, _, e in engines if e is not None)
        out.append(Finding(
            "excluded-entry-not-read", "info",
            f"{len(keys)} module pattern(s) stored quantized are named by {lists or 'the declared lists'} "
            f"(e.g. {', '.join(keys[:3])}), which {names} do not read for method {method}: they build these "
            f"modules quantized, as stored [{not_read[0][2]}]. Patterns: {', '.join(keys)}",
            subject=not_read[0][1].subject,
            reference="rules/quant/sglang.yaml, rules/quant/vllm.yaml (each engine's reading of the lists)"))
    return replace(checkpoint, findings=tuple(out))


def _answer(finding: Finding, key: str, groups: list[TensorGroup], engines,  # noqa: ANN001
            declared, method) -> tuple[list[Finding], str]:  # noqa: ANN001
    """(the findings that stay, the engines' source when every engine that answers builds the modules
    quantized, else "")."""
    if not groups or not engines:
        return [finding], ""
    verdicts: dict[str, tuple[str, str]] = {}  # engine -> (QUANTIZED / UNQUANTIZED / ERROR / "undecided", why)
    for name, version, section, entry in engines:
        if entry is None:
            verdicts[name] = ("undecided", f"rules/quant/{name}.yaml does not model {method} at {version}")
            continue
        packed = section.get("packed", {})
        answer: tuple[str, str] | None = None
        for g in groups:
            for member, _ in weighted_members(g, declared.excludes):
                module, kind = engine_module(g, member, packed)
                d = decide(section, entry, declared, module, kind)
                if d.built == UNKNOWN:
                    answer = ("undecided", d.why)
                elif d.built != QUANTIZED:
                    answer = (d.built, f"{module}: {d.why} [{d.source}]")
                if answer is not None:
                    break
            if answer is not None:
                break
        verdicts[name] = answer or (QUANTIZED, d.source)
    unquantized = [n for n, (b, _) in verdicts.items() if b not in (QUANTIZED, "undecided")]
    undecided = [n for n, (b, _) in verdicts.items() if b == "undecided"]
    quantized = [n for n, (b, _) in verdicts.items() if b == QUANTIZED]
    if not quantized:
        return [finding], ""  # every engine that answers agrees with the generic reading (or none answers)
    out: list[Finding] = []
    for name in unquantized + undecided:
        why = verdicts[name][1]
        note = "builds unquantized parameters" if name in unquantized else "is not decided by its modelled reading"
        out.append(replace(finding, engine=name, message=f"{finding.message} ({_LABEL[name]} {note}: {why})"))
    return out, verdicts[quantized[0]][1]
