"""Whether an engine version knows a checkpoint's quantization method at all (rules/quant/<engine>.yaml
``known_methods``).

Both engines check the method name against their registry before any model is built
(vllm/config/model.py and sglang/srt/configs/model_config.py ``ModelConfig._verify_quantization``): a
name not there refuses the whole checkpoint at start-up, so no per-module decision applies. The name
asked is the one ckptinspect derives (readiness/quant_method.py ``engine_method``) after the engine's
own renamings (``aliases``). A method whose declaration file the engine does not read (``unread``, e.g.
ModelSlim's quant_model_description.json in vLLM) is reported with its own reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ckptinspect.readiness.versions import in_range

if TYPE_CHECKING:
    from ckptinspect.readiness.context import EngineContext
    from ckptinspect.records import DeclaredQuant

METHOD_UNKNOWN = "quant-method-unknown-to-engine"


@dataclass(frozen=True)
class MethodSupport:
    """The engine's view of one declared method: ``known`` False means the engine cannot serve the
    checkpoint at all; ``message`` says why in the engine's words (or ours, for an unread file)."""

    method: str
    registry_name: str
    known: bool
    message: str
    source: str


def method_entry(section: Mapping[str, Any] | None, version: str) -> Mapping[str, Any] | None:
    """The ``known_methods`` entry whose version range holds ``version`` (None: not modelled)."""
    if not section:
        return None
    return next((e for e in section.get("known_methods", ()) if in_range(version, e["versions"])), None)


def registry_name(entry: Mapping[str, Any], method: str) -> str:
    """The name the engine looks up in its registry for the checkpoint's (lower-cased) method."""
    return entry.get("aliases", {}).get(method, method)


def method_support(section: Mapping[str, Any] | None, method: str | None, version: str,
                   engine_label: str) -> MethodSupport | None:
    """None when the checkpoint declares no method or the engine version's list is not modelled (then
    nothing is claimed either way); otherwise whether the engine knows the method and, if not, why."""
    entry = method_entry(section, version)
    if method is None or entry is None:
        return None
    name = registry_name(entry, method)
    unread = entry.get("unread", {}).get(method)
    if unread is not None:
        return MethodSupport(method, name, False, unread.format(version=version), entry["source"])
    known = name in entry["methods"]
    message = "" if known else (f"{engine_label} {version} refuses the checkpoint at start-up: "
                                + entry["refusal"].format(method=name))
    return MethodSupport(method, name, known, message, entry["source"])


def modelopt_algo_refusal(section: Mapping[str, Any] | None, declared: "DeclaredQuant", version: str,
                          engine_label: str) -> MethodSupport | None:
    """The entry's ``modelopt_algos`` check: a ModelOpt block the engine reads (producer ``modelopt``, declared
    in hf_quant_config.json alone: vLLM reads config.json's quantization_config first, and the flat layout
    there has no ``quantization.quant_algo`` for the check to read) whose algo the engine maps to no method
    is refused at start-up. None when the check does not apply or passes."""
    entry = method_entry(section, version)
    rule = entry.get("modelopt_algos") if entry is not None else None
    algo = (declared.algo or "").upper()
    if (rule is None or declared.producer != "modelopt" or not algo
            or [s.split(":", 1)[0] for s in declared.sources] != ["hf_quant_config.json"]):
        return None
    if algo in {a.upper() for a in rule["algos"]}:
        return None
    return MethodSupport(declared.method or "modelopt", declared.method or "modelopt", False,
                         f"{engine_label} {version} refuses the checkpoint at start-up: "
                         + rule["refusal"].format(algo=declared.algo), rule["source"])


def support_for(ctx: "EngineContext") -> MethodSupport | None:
    """method_support for one engine context (the checkpoint's derived method at the context's version),
    after the engine's ModelOpt algo check (``modelopt_algos``), which runs before its registry is asked."""
    from ckptinspect.readiness.module_quant import module_quant_rules

    label = "vLLM" if ctx.engine.engine == "vllm" else ctx.engine.engine
    section = module_quant_rules(ctx.engine.engine)
    refused = modelopt_algo_refusal(section, ctx.facts.checkpoint.declared, ctx.version, label)
    if refused is not None:
        return refused
    return method_support(section, ctx.facts.engine_method, ctx.version, label)
