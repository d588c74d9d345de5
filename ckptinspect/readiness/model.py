"""Frozen records for family rules (the parsed form of ``rules/families/*.yaml``).

The YAML format is documented in docs/rules_format.md and enforced by
``rules/schema/family.schema.json``; this module only holds the validated result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ckptinspect.records import ModelConfig

ENGINES = ("sglang", "vllm")
DEFAULT_SEVERITY = {"unusable": "error", "degraded": "warning", "ready": "info", "absent": "info"}


@dataclass(frozen=True)
class Defect:
    """A known defect pattern: when ``when`` holds, the engine's verdict is at most ``verdict``."""

    code: str
    when: Mapping[str, Any]
    verdict: str
    severity: str
    message: str
    remedy: str | None = None
    reference: str | None = None
    versions: str | None = None  # engine versions the defect applies to; None = all
    per_module_facts: tuple[str, ...] = ()  # the per-module conditions of ``when`` it rests on (module table)


@dataclass(frozen=True)
class Check:
    """An engine-independent observation (e.g. MTP present although no config key says so)."""

    code: str
    when: Mapping[str, Any]
    severity: str
    message: str
    remedy: str | None = None
    reference: str | None = None


@dataclass(frozen=True)
class DraftQuantRule:
    """How the engine builds the draft's quantization; the first rule whose ``when`` holds wins."""

    result: str  # unquantized | inherit | per_module
    when: Mapping[str, Any] | None = None
    note: str | None = None
    reference: str | None = None


@dataclass(frozen=True)
class ForcedUnquantized:
    """MTP modules the engine builds unquantized whatever the exclude list says."""

    modules: tuple[str, ...]  # relative to the layout base
    when: Mapping[str, Any] | None = None
    versions: str | None = None
    reference: str | None = None


@dataclass(frozen=True)
class RuntimeName:
    """A prefix rename the engine applies before matching exclude lists."""

    source: str  # template
    target: str  # replacement (may use {L}, {k}, {L+k})


@dataclass(frozen=True)
class EngineRule:
    engine: str
    version: str
    draft_architecture: str | None
    method: str | None
    layer_use: str  # reuse_first | per_step
    source: str | None
    runtime_names: tuple[RuntimeName, ...] = ()
    # which spelling the engine asks the declared lists about: "either" (some releases match the checkpoint
    # name, some the runtime one: sgl-project/sglang PR #34906), "runtime" (the draft class maps no names)
    exclude_names: str = "either"
    forced_unquantized: tuple[ForcedUnquantized, ...] = ()
    draft_quant: tuple[DraftQuantRule, ...] = ()
    defects: tuple[Defect, ...] = ()


@dataclass(frozen=True)
class Requirement:
    """A required sub-module: satisfied when every name of one alternative is present."""

    alternatives: tuple[tuple[str, ...], ...]

    @property
    def label(self) -> str:
        return " | ".join("+".join(alt) for alt in self.alternatives)


@dataclass(frozen=True)
class ExpertLayout:
    per_expert: tuple[str, ...]  # e.g. "mlp.experts.{e}.gate_proj"
    grouped: tuple[tuple[str, ...], ...] = ()  # 3-D alternatives, e.g. ("mlp.experts.gate_up_proj", ...)
    count_keys: tuple[str, ...] = ()  # dotted config keys; falls back to ModelConfig.routed_experts


@dataclass(frozen=True)
class MtpLayout:
    supported: bool
    depth_keys: tuple[str, ...]
    depth_default: int
    depth_note: str | None
    prefixes: tuple[str, ...]
    base: str | None
    required: tuple[Requirement, ...]
    optional: tuple[str, ...]
    experts: ExpertLayout | None
    files: tuple[str, ...]
    # boolean config keys whose true value makes the engines build `depth_default` layers (no count key)
    depth_flag_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyRule:
    """One model family: how to recognise it and how each engine treats its MTP layer."""

    id: str
    name: str
    description: str | None
    references: tuple[str, ...]
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    abstract: bool
    extends: str | None
    mtp: MtpLayout
    checks: tuple[Check, ...]
    engines: Mapping[str, EngineRule]
    source: str  # the file the rule came from (the child file when it extends another)
    origin: int  # 0 = built-in, 1.. = position of the --rules-dir that supplied it
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)  # merged YAML
    # match.config_keys_any: the family matches only a config.json (or its text_config) that sets one
    # of these keys to a non-null value, and then outranks a family of the same architecture without
    # them (a DeepSeek-V4 release bundling a DSpark draft is told apart by its dspark_* keys alone).
    config_keys: tuple[str, ...] = ()
    # draft_subfolders: stand-alone drafts the engines find in a subfolder of this (target) checkpoint
    # themselves (MiniMax-M3's dspark/); the report reads and judges each one (pipeline.py assess_drafts)
    draft_subfolders: tuple["DraftSubfolder", ...] = ()

    @property
    def mtp_prefixes(self) -> tuple[str, ...]:
        """Prefix templates the inventory uses to assign ``TensorGroup.mtp_layer``."""
        return self.mtp.prefixes if self.mtp.supported else ()

    def match_score(self, config: ModelConfig) -> int:
        """6 = architecture, 4 = model_type, 2 = text_config.model_type, 0 = no match; +1 when the
        family's config_keys_any matched (a family with config keys never matches without one)."""
        if self.abstract:
            return 0
        bonus = 0
        if self.config_keys:
            if not declares_any_key(config, self.config_keys):
                return 0
            bonus = 1
        archs = config.raw.get("architectures") if isinstance(config.raw, Mapping) else None
        names = {config.architecture, *(a for a in (archs or ()) if isinstance(a, str))}
        if names & set(self.architectures):
            return 6 + bonus
        if config.model_type in self.model_types:
            return 4 + bonus
        if config.text_model_type and config.text_model_type in self.model_types:
            return 2 + bonus
        return 0


def declares_any_key(config: ModelConfig, keys: tuple[str, ...]) -> bool:
    """True when config.json or its text_config sets one of ``keys`` to a non-null value."""
    raw = config.raw if isinstance(config.raw, Mapping) else {}
    text = raw.get("text_config")
    scopes = (raw, text) if isinstance(text, Mapping) else (raw,)
    return any(scope.get(key) is not None for scope in scopes for key in keys)


@dataclass(frozen=True)
class DraftAbsent:
    """What one engine does, at the versions given, when the target has no such draft subfolder."""

    code: str
    verdict: str
    message: str
    reference: str
    versions: str | None = None
    remedy: str | None = None


@dataclass(frozen=True)
class DraftSubfolder:
    """A family's ``draft_subfolders`` entry: the subfolder name, the family its config.json must match,
    the engines' lookup (reference) and, per engine, what it does when the subfolder is missing."""

    path: str
    family: str
    reference: str
    absent: Mapping[str, tuple[DraftAbsent, ...]]

    def absent_rule(self, engine: str, version: str) -> DraftAbsent | None:
        """The first ``absent`` entry of ``engine`` whose versions hold at ``version``."""
        from ckptinspect.readiness.versions import in_range

        return next((a for a in self.absent.get(engine, ()) if not a.versions or in_range(version, a.versions)),
                    None)


@dataclass(frozen=True)
class RuleSet:
    """Every loaded family (abstract bases included), later ``--rules-dir`` overriding earlier."""

    families: tuple[FamilyRule, ...]
    directories: tuple[str, ...]

    def get(self, family_id: str) -> FamilyRule | None:
        for fam in self.families:
            if fam.id == family_id:
                return fam
        return None

    def concrete(self) -> tuple[FamilyRule, ...]:
        return tuple(f for f in self.families if not f.abstract)

    def match(self, config: ModelConfig) -> FamilyRule | None:
        """The family whose match list fits ``config`` best (architecture > model_type > text)."""
        best: tuple[int, int] = (0, -1)
        found: FamilyRule | None = None
        for fam in self.families:
            score = fam.match_score(config)
            if score and (score, fam.origin) > best:
                best, found = (score, fam.origin), fam
        return found

    @property
    def generic(self) -> FamilyRule | None:
        """The abstract rule used for checkpoints of an unknown family."""
        return self.get("generic")
