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


def support_for(ctx: "EngineContext") -> MethodSupport | None:
    """method_support for one engine context (the checkpoint's derived method at the context's version)."""
    from ckptinspect.readiness.module_quant import module_quant_rules

    label = "vLLM" if ctx.engine.engine == "vllm" else ctx.engine.engine
    return method_support(module_quant_rules(ctx.engine.engine), ctx.facts.engine_method, ctx.version, label)
