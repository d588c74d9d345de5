"""MTP head per family, chosen by data (``families.yaml``), never by if-chains on family names."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml


@dataclass(frozen=True)
class HeadSpec:
    """One entry of ``families.yaml``: how to find and run a family's MTP layer."""

    id: str
    model_types: tuple[str, ...]
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
    norm_from_main: bool = True
    block_attention: str | None = None

    def concrete_prefix(self, num_hidden_layers: int) -> str:
        return self.prefix.replace("{L}", str(num_hidden_layers))


@lru_cache(maxsize=1)
def load_specs() -> tuple[HeadSpec, ...]:
    text = resources.files(__package__).joinpath("families.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    specs = []
    for entry in data["families"]:
        entry = dict(entry)
        entry["model_types"] = tuple(entry["model_types"])
        entry["required"] = tuple(entry.get("required", ()))
        entry["block"] = entry.get("block") or ""
        specs.append(HeadSpec(**entry))
    return tuple(specs)


def text_model_type(config: Mapping[str, Any]) -> str:
    """The language model's model_type (text_config's for multimodal wrappers)."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and text.get("model_type"):
        return str(text["model_type"])
    return str(config.get("model_type", ""))


def find_spec(config: Mapping[str, Any]) -> HeadSpec | None:
    """The head spec for a config.json dict; tries the wrapper's model_type, then the text one."""
    candidates = [str(config.get("model_type", "")), text_model_type(config)]
    for spec in load_specs():
        if any(c in spec.model_types for c in candidates):
            return spec
    return None
