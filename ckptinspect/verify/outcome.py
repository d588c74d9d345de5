"""The engine script's answer -> a VerifyResult: parameters grouped by module, the outcome decided."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ckptinspect.verify.records import TARGET_COPY, ModuleOutcome, ParameterOutcome, StepOutcome, VerifyResult


def outcome_of(steps: tuple[StepOutcome, ...], modules: tuple[ModuleOutcome, ...], finished: bool, *,
               draft_is_target: bool = False, mtp_tensors_loaded: int = 0) -> str:
    """``load failed`` when a step raised in the engine; ``not run`` when the script stopped before loading
    for another reason (a dtype this torch lacks); ``target copy`` when the engine built the target model's
    own class as the draft (``draft_is_target``) and no stored MTP tensor reached it: whatever it loaded is
    the trunk, so it is no MTP head, however cleanly it loads (SGLang 0.5.23 does this for an architecture
    its configs/model_config.py ``_config_draft_model`` does not rename, e.g. MiniMaxM2ForCausalLM);
    ``defects`` when a parameter was mis-loaded or never loaded; else ``loads``. A stored MTP tensor the
    engine skipped is listed, not a defect by itself: the engines skip the copies of what they share with
    the target (SGLang's NextN skips shared_head.head and embed_tokens), and a skipped tensor that mattered
    leaves its parameter never loaded."""
    failed = [step for step in steps if not step.ok]
    if failed:
        return "load failed" if any(step.error and step.where and not step.platform for step in failed) else "not run"
    if not finished:
        return "not run"
    if draft_is_target and mtp_tensors_loaded == 0:
        return TARGET_COPY
    bad = any(p.status in ("mismatch", "never loaded") for m in modules for p in m.parameters)
    return "defects" if bad else "loads"


def result_from_answer(ref: str, location: str, engine: str, python: str, answer: dict[str, Any],
                       seconds: float) -> VerifyResult:
    steps = tuple(StepOutcome(step=s["step"], ok=bool(s["ok"]), seconds=float(s.get("seconds", 0.0)),
                              error=s.get("error"), where=s.get("where") or None, tensor=s.get("tensor"),
                              platform=bool(s.get("platform")))
                  for s in answer.get("steps", ()))
    by_module: dict[str, list[ParameterOutcome]] = {}
    for p in answer.get("parameters", ()):
        module, _, leaf = p["name"].rpartition(".")
        by_module.setdefault(module, []).append(ParameterOutcome(
            name=leaf, dtype=p["dtype"], shape=tuple(p["shape"]), status=p["status"], calls=int(p["calls"]),
            sources=tuple(p.get("sources", ())), source_count=int(p.get("source_count", 0)),
            problems=tuple(p.get("problems", ())), note=p.get("note")))
    modules = tuple(ModuleOutcome(module=m, parameters=tuple(ps)) for m, ps in by_module.items())
    tensors = answer.get("tensors") or {}
    skipped = tuple(tensors.get("skipped_mtp", ()))
    finished = "parameters" in answer
    loaded = tensors.get("loaded_mtp", ())
    result = VerifyResult(
        ref=ref, location=location, engine=engine, engine_version=answer.get("engine_version"), python=python,
        outcome="not run", method=answer.get("method"),
        draft_architectures=tuple(answer.get("draft_architectures", ())), draft_class=answer.get("draft_class"),
        quantization=answer.get("quantization"), quant_config=answer.get("quant_config"), steps=steps,
        modules=modules, tensors_offered=int(tensors.get("offered", 0)),
        mtp_tensors_loaded=len(loaded), mtp_tensors_skipped=skipped,
        mtp_tensor_targets=tuple((name, tuple(params)) for name, params in (tensors.get("mtp_targets") or {}).items()),
        other_tensors_loaded=tuple(tensors.get("loaded_other", ())),
        other_tensors_skipped=int(tensors.get("skipped_other", 0)), shims=tuple(answer.get("shims", ())),
        not_run=tuple(answer.get("not_run", ())), seconds=round(seconds, 2),
        target_architectures=tuple(answer.get("target_architectures", ())))
    return replace(result, outcome=outcome_of(steps, modules, finished, draft_is_target=result.draft_is_target,
                                              mtp_tensors_loaded=len(loaded)))
