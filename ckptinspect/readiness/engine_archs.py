"""Whether an engine version has a model class for a checkpoint's architecture at all
(rules/engines/architectures.yaml, read from each engine's own registry by scripts/engine_architectures.py).

Both engines look the config's ``architectures`` up in their model registry before anything is built:
- SGLang 0.5.23 (SG:model_loader/utils.py get_model_architecture): if no architecture is registered, or
  always with --model-impl transformers, resolve_transformers_arch serves it through SGLang's Transformers
  backend when ``getattr(transformers, arch)`` or the config's ``auto_map`` AutoModel gives a class that is
  backend-compatible, and raises ValueError ("Cannot find model module ...") otherwise. SGLang pins
  transformers exactly (==5.19.0), so whether transformers exports the class is decided from that release's
  class list; whether the class is backend-compatible is not modelled (the answer then says so).
- vLLM (VL:model_executor/models/registry.py inspect_model_cls): with model_impl auto and no architecture
  registered, _try_resolve_transformers tries the Transformers backend the same way (transformers class or
  auto_map AutoModel, backend-compatible); failing that, _normalize_arch swaps the head suffix
  (``FooForConditionalGeneration`` -> a registered ``FooForCausalLM``, vllm/config/model.py
  _SUFFIX_TO_DEFAULTS), and only then _raise_for_unsupported refuses. vLLM allows a range of transformers
  releases, so an architecture neither registered nor reachable by a suffix swap is "not decided" for it
  unless the checkpoint's auto_map answers.

The one answer (``arch_support``) feeds the MTP verdict (an engine that cannot build the target cannot
draft for it), the report's finding and the plan (no launch command), so the three agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ckptinspect.records import ModelConfig
from ckptinspect.rules.documents import load_rule_document, rules_root

ARCH_UNKNOWN = "arch-unknown-to-engine"  # the engine refuses the checkpoint: no model class, no fallback
ARCH_FALLBACK = "arch-served-by-transformers-backend"  # not registered; the engine's Transformers backend
ARCH_UNDECIDED = "arch-support-not-decided"  # not registered; the fallback depends on what is installed
SCHEMA = "engine_architectures.schema.json"
DATA = "rules/engines/architectures.yaml"
ENGINE_LABEL = {"sglang": "sglang", "vllm": "vLLM"}
# vllm/config/model.py _SUFFIX_TO_DEFAULTS: the head suffixes _normalize_arch swaps (the generating ones
# match a generating checkpoint; it then tries every suffix for a registered base).
VLLM_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel", "ForTextEncoding",
                 "EmbeddingModel", "ForSequenceClassification", "ForTokenClassification", "ForAudioClassification",
                 "ForImageClassification", "ForVideoClassification", "ClassificationModel", "ForRewardModeling",
                 "RewardModel", "Model")
VLLM_GENERATE_SUFFIXES = VLLM_SUFFIXES[:4]


@dataclass(frozen=True)
class ArchSupport:
    """One engine version's answer for the checkpoint's architectures.

    ``status``: ``registered`` (a model class, possibly under the name ``served_as``), ``transformers``
    (no class of its own; the engine's Transformers backend takes it), ``undecided`` (no class of its own;
    the fallback depends on the installed transformers) or ``refused`` (the engine raises at start-up).
    ``code`` is the finding code for every status but ``registered``."""

    engine: str
    version: str
    architecture: str
    status: str
    served_as: str
    message: str
    source: str

    @property
    def code(self) -> str | None:
        return {"refused": ARCH_UNKNOWN, "transformers": ARCH_FALLBACK, "undecided": ARCH_UNDECIDED}.get(self.status)


@lru_cache(maxsize=1)
def _registries() -> dict[tuple[str, str], Mapping[str, Any]]:
    doc = load_rule_document(rules_root() / "engines" / "architectures.yaml", SCHEMA, builtin=True)
    return {(r["engine"], r["version"]): r for r in doc["registries"]}


@lru_cache(maxsize=None)
def _names(engine: str, version: str) -> frozenset[str]:
    return frozenset(_registries()[(engine, version)]["architectures"])


def registry(engine: str, version: str) -> Mapping[str, Any] | None:
    """The data file's entry for one engine version (None: that version's registry is not recorded)."""
    return _registries().get((engine, version))


def declared_architectures(config: ModelConfig) -> tuple[str, ...]:
    """config.json ``architectures`` (top level, else text_config's: ckptinspect/config/normalize.py reads
    them in that order; for params.json, the config vLLM's adapter builds)."""
    raw = config.raw.get("architectures") or config.text.get("architectures") or ()
    return tuple(a for a in raw if isinstance(a, str)) if isinstance(raw, list) else ()


def arch_support(engine: str, version: str, config: ModelConfig) -> ArchSupport | None:
    """The engine version's answer for the checkpoint's architectures; None when the config declares none
    or the version's registry is not recorded in rules/engines/architectures.yaml (nothing is claimed)."""
    entry = registry(engine, version)
    archs = declared_architectures(config)
    if entry is None or not archs:
        return None
    names = _names(engine, version)
    label = f"{ENGINE_LABEL.get(engine, engine)} {version}"
    cite = f"{DATA} {engine} {version}: {entry['source'].split(' ', 2)[-1]}"
    arch = archs[0]
    renames = {r["from"]: r for r in entry.get("renames", ())}
    for a in archs:
        # the engine's config class renames it before the registry is asked
        to = renames[a]["to"] if a in renames else a
        if to in names:
            source = cite if to == a else f"{cite}; {renames[a]['source']}"
            return ArchSupport(engine, version, a, "registered", to, "", source)
    if engine == "vllm":
        # _normalize_arch runs after the Transformers fallback, but a registered base of the same model
        # makes the answer "it loads" either way.
        swapped = _suffix_swap(arch, names)
        if swapped is not None:
            return ArchSupport(engine, version, arch, "registered", swapped,
                               f"{label} registers no model class named {arch}; it serves it as {swapped} "
                               "(the same model under another head suffix)", cite + "; VL:model_executor/models/"
                               "registry.py _normalize_arch")
    fallback = entry.get("fallback", "")
    which = "any of " + ", ".join(archs) if len(archs) > 1 else arch
    if any(k.startswith("AutoModel") for k in (config.raw.get("auto_map") or {})):
        return ArchSupport(engine, version, arch, "transformers", "", (
            f"{label} registers no model class for {which}; it serves the checkpoint through its Transformers "
            "backend with the class the config's auto_map names (remote code: --trust-remote-code), if that "
            "class is backend-compatible"), f"{cite}; {fallback}")
    pin = entry.get("transformers") or ""
    pinned = registry("transformers", pin[2:]) if pin.startswith("==") else None
    if pinned is None:
        return ArchSupport(engine, version, arch, "undecided", "", (
            f"{label} registers no model class for {which}; whether its Transformers backend serves it depends "
            f"on the transformers release installed with it ({'requirement ' + pin if pin else 'not recorded'}): "
            "not decided here"), f"{cite}; {fallback}")
    if arch in _names("transformers", pin[2:]):
        return ArchSupport(engine, version, arch, "transformers", "", (
            f"{label} registers no model class for {which}; it falls back to its Transformers backend "
            f"(transformers {pin[2:]}, which it pins, exports {arch}), which serves it only if that class is "
            "backend-compatible"), f"{cite}; {fallback}")
    return ArchSupport(engine, version, arch, "refused", "", (
        f"{label} registers no model class for {which} and its Transformers fallback finds none (its pinned "
        f"transformers {pin[2:]} has no {arch}, the config no auto_map AutoModel): it refuses the checkpoint "
        "at start-up"), f"{cite}; {fallback}")


def _suffix_swap(arch: str, names: frozenset[str]) -> str | None:
    suffix = next((s for s in VLLM_GENERATE_SUFFIXES if arch.endswith(s)), None)
    if suffix is None:
        return None
    return next((base for repl in VLLM_SUFFIXES if (base := arch.replace(suffix, repl)) in names), None)
