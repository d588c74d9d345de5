"""The per-engine launch commands of a plan: rule choices, the solver's changes, speculative flags."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ckptinspect.plan.backends import Choice, choose, engine_auto, parsers_for
from ckptinspect.plan.command import Command, FlagLine, LaunchInputs
from ckptinspect.plan.kvcache import MemFraction
from ckptinspect.plan.options import Option
from ckptinspect.plan.result import Note
from ckptinspect.plan.rules import PlanFacts, engine_rule_file, engine_rules, first_match
from ckptinspect.plan.serve_target import serve_target
from ckptinspect.plan.sglang import sglang_command
from ckptinspect.plan.solver import ContextSolution
from ckptinspect.plan.speculative import draft_moe_flags, spec_values, tree_draft_attention
from ckptinspect.plan.vllm import vllm_command
from ckptinspect.readiness.engine_archs import arch_support
from ckptinspect.records import Checkpoint, MtpAssessment

SPEC_VERDICTS = ("ready", "degraded")
# SGLang --kv-cache-dtype values -> vLLM's spelling.
VLLM_KV = {"fp8_e4m3": "fp8"}


def probe_declines(probe_report: dict | None) -> bool:
    """The probe projected no gain at any step count (recommendation.enabled false)."""
    return ((probe_report or {}).get("recommendation") or {}).get("enabled") is False


def _spec_on(mtp: MtpAssessment | None, engine: str) -> bool:
    v = mtp.verdicts.get(engine) if mtp else None
    return bool(v and v.verdict in SPEC_VERDICTS)


def _solver_choices(engine: str, choices: tuple[Choice, ...], solution: ContextSolution | None) -> tuple[Choice, ...]:
    """Apply the solver's KV dtype and chunked-prefill changes to the rule choices."""
    if solution is None or solution.chosen.id == "defaults":
        return choices
    step = solution.chosen
    kv_steps = [s for s in solution.steps if s.id != "defaults" and not s.skipped and s.kv_dtype == step.kv_dtype]
    out = list(choices)
    base_kv = solution.steps[0].kv_dtype
    if step.kv_dtype != base_kv:
        value = VLLM_KV.get(step.kv_dtype, step.kv_dtype) if engine == "vllm" else step.kv_dtype
        flag = "--kv-cache-dtype"
        out = [c for c in out if c.setting != "kv_cache_dtype"]
        out.append(Choice("kv_cache_dtype", flag, value, f"max-context solver: {kv_steps[0].risk}", kv_steps[0].source))
    chunked = step.mem.chunked_prefill_size
    if engine == "sglang" and chunked != solution.steps[0].mem.chunked_prefill_size:
        src = next(s for s in solution.steps if s.mem.chunked_prefill_size == chunked and not s.skipped)
        out.append(Choice("chunked_prefill_size", "--chunked-prefill-size", str(chunked),
                          f"max-context solver: {src.risk}", src.source))
    return tuple(out)


def _mem_flag(engine: str, mem: MemFraction, facts: PlanFacts, solution: ContextSolution | None) -> tuple[float, str, str]:
    lifted = solution is not None and solution.chosen.mem.value > solution.steps[0].mem.value
    if engine == "sglang":
        why = f"SGLang's rule gives {mem.formula:g} (reserve {mem.reserved_mib / 1024:.1f} GiB for activations + graphs)"
        if mem.cap_reason:
            why += f"; capped: {mem.cap_reason}"
        if lifted:
            step = next(s for s in solution.steps if not s.skipped and s.mem.value > solution.steps[0].mem.value)
            why += f"; max-context solver: {step.risk}"
        return mem.value, why, mem.source
    rules = engine_rules("vllm")["memory"]
    cap = first_match(rules["caps"], facts, source=engine_rule_file("vllm"))
    value = rules["default_utilization"]
    if cap and cap["max_fraction"] < value and not lifted:
        return cap["max_fraction"], f"{cap['reason']}", cap["source"]
    if lifted:
        return value, (f"vLLM default share, above the field cap: the max-context solver needs the larger pool "
                       f"(risk: {cap['reason'] if cap else 'OOM on the first long prefill'})"), rules["source"]
    return value, "vLLM default share of GPU memory for weights + KV", rules["source"]


def build_commands(ck: Checkpoint, mtp: MtpAssessment | None, facts: PlanFacts, engines: tuple[str, ...], chosen: Option,
                   *, context: int, goal: str, probe_report: dict | None, running: int, running_reason: str,
                   solution: ContextSolution | None) -> tuple[dict[str, Any], dict[str, Command], list[Note]]:
    cfg = ck.config
    draft_off = solution is not None and not solution.chosen.spec and facts.spec
    speculative: dict[str, Any] = {}
    commands: dict[str, Command] = {}
    notes: list[Note] = []
    for name in engines:
        arch = arch_support(name, engine_rules(name)["version"], cfg)
        if arch is not None and arch.status == "refused":
            # A command for an engine with no model class for the target fails after the download: none is
            # printed (the report's finding and the MTP verdict say the same, readiness/assess.py).
            notes.append(Note("warning", f"{name}: no launch command: {arch.message} (finding {arch.code})",
                              arch.source))
            continue
        if arch is not None and arch.code is not None:
            notes.append(Note("warning" if arch.status == "undecided" else "info", f"{name}: {arch.message}",
                              arch.source))
        declined = _spec_on(mtp, name) and probe_declines(probe_report)
        on = _spec_on(mtp, name) and not draft_off and not declined
        efacts = PlanFacts(**{**facts.__dict__, "spec": on})
        choices, avoid = choose(name, efacts)
        values, reason = spec_values(name, mtp, goal, probe_report) if on else ({}, "")
        if name == "sglang" and values.get("eagle_topk", 1) > 1:
            choices = tree_draft_attention(choices, efacts)
        choices = _solver_choices(name, choices, solution)
        speculative[name] = values or None
        if draft_off and _spec_on(mtp, name):
            notes.append(Note("warning", f"{name}: speculative flags dropped by the max-context solver "
                              f"({solution.chosen.risk})", solution.chosen.source))
        elif mtp and name in mtp.verdicts and not on:
            notes.append(Note("info", f"{name}: no speculative flags, MTP verdict is {mtp.verdicts[name].verdict}",
                              "ckptinspect readiness (MtpAssessment)"))
        if mtp and name in mtp.verdicts and "quant-method-unknown-to-engine" in mtp.verdicts[name].reasons:
            notes.append(Note("warning", f"{name}: this engine version does not know the checkpoint's quantization "
                              "method and refuses it at start-up: the command above will not serve it "
                              "(finding quant-method-unknown-to-engine)", "rules/quant/" + name + ".yaml known_methods"))
        if declined:
            rec = probe_report["recommendation"] if probe_report else {}
            speedup = rec.get("projected_speedup_bs1")
            at = f" (x{speedup:.2f} at batch 1)" if isinstance(speedup, (int, float)) else ""
            notes.append(Note(
                "warning", f"{name}: no speculative flags: the probe projects that MTP does not pay off{at}; "
                "add them only if your own traffic accepts more drafts than the probe's prompts",
                "ckptinspect probe --format json (recommendation.enabled)"))
        if on and mtp.verdicts[name].verdict == "degraded":
            notes.append(Note("warning", f"{name}: MTP verdict is degraded; expect lower acceptance "
                              f"({', '.join(mtp.verdicts[name].reasons)})", "ckptinspect readiness (MtpAssessment)"))
        draft: tuple[FlagLine, ...] = ()
        if on and name == "sglang":
            draft = draft_moe_flags(ck, efacts, facts.quant, choices)
        elif on and name == "vllm":
            rules = engine_rules("sglang")["draft"]
            notes.append(Note("info", f"vllm: {rules['vllm_note']}", rules["vllm_source"]))
        mem_value, mem_reason, mem_source = _mem_flag(name, chosen.mem, efacts, solution)
        caveats: tuple[str, ...] = ()
        if name == "vllm" and solution is not None:
            vl = engine_rules("vllm")["memory"]
            caveats = (f"{vl['solver_caveat']} ({vl['solver_caveat_source']})",)
        parsers = parsers_for(name, efacts)
        if parsers and parsers.get("note"):
            notes.append(Note("info", f"{name}: {parsers['note']}", parsers["source"]))
        model_path, revision = serve_target(ck)
        inputs = LaunchInputs(
            model_path=model_path, revision=revision, tp=chosen.memory.tp, ep=chosen.memory.ep,
            context=context, goal=goal, mem_fraction=mem_value, mem_fraction_reason=mem_reason,
            mem_fraction_source=mem_source, max_running_requests=running,
            running_reason=running_reason, running_source=engine_rules(name)["requests"]["source"],
            choices=choices, avoid=avoid, parsers=parsers, spec_enabled=on,
            spec=values, spec_reason=reason, trust_remote_code=cfg.has_remote_code, draft_flags=draft,
            caveats=caveats)
        command = sglang_command(inputs) if name == "sglang" else vllm_command(inputs, efacts)
        autos, alternatives = engine_auto(name, efacts, choices)
        commands[name] = replace(command, engine_auto=autos, alternatives=alternatives)
    return speculative, commands, notes
