"""MTP head per family, described by data: the ``probe:`` block of the family's rule file
(``rules/families/*.yaml``, schema ``rules/schema/family.schema.json``), never by if-chains on names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import ProbeError


@dataclass(frozen=True)
class HeadSpec:
    """One family's ``probe:`` block: how to find and run its MTP layer."""

    id: str  # the rule family id
    kind: str  # transformers | fusion
    prefix: str  # may contain {L}
    required: tuple[str, ...]
    main_model_type: str | None = None
    emb_norm: str | None = None
    hidden_norm: str | None = None
    proj: str | None = None
    proj_bias: Any = False  # False | True | "auto"
    block: str = ""
    final_norm: str | None = None
    hidden_first: bool = False
    block_attention: str | None = None

    def concrete_prefix(self, num_hidden_layers: int) -> str:
        return self.prefix.replace("{L}", str(num_hidden_layers))


def spec_from_rule(family_id: str, block: Mapping[str, Any]) -> HeadSpec:
    fields = {k: v for k, v in block.items() if k not in ("head", "references")}
    fields["required"] = tuple(block.get("required", ()))
    fields["block"] = block.get("block") or ""
    return HeadSpec(id=family_id, kind=str(block["head"]), **fields)


def spec_for_family(family_id: str) -> HeadSpec | None:
    """The head spec of a rule family (None when the family has no ``probe:`` block)."""
    from ckptinspect.readiness import load_rules

    family = load_rules().get(family_id)
    if family is None:
        raise ProbeError(f"no rule family {family_id!r}")
    block = family.document.get("probe")
    return spec_from_rule(family.id, block) if isinstance(block, Mapping) else None


def find_spec(config: Mapping[str, Any]) -> HeadSpec | None:
    """The head spec for a config.json dict, through the same family match as the report."""
    from ckptinspect.config.normalize import normalize_config
    from ckptinspect.readiness import load_rules

    family = load_rules().match(normalize_config(config, source="config.json"))
    return None if family is None else spec_for_family(family.id)


def text_model_type(config: Mapping[str, Any]) -> str:
    """The language model's model_type (text_config's for multimodal wrappers)."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and text.get("model_type"):
        return str(text["model_type"])
    return str(config.get("model_type", ""))
