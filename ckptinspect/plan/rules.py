"""The plan rule files (rules/gpus.yaml, rules/engines/*.yaml) and their `when` conditions.

Rules are data: files are read and schema-checked by ckptinspect/rules (the one loader and validator of
every rule file); this module holds the plan's view of them and evaluates `when` conditions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ckptinspect.errors import RuleError
from ckptinspect.rules.documents import load_validated, rules_root


@lru_cache(maxsize=None)
def gpu_rules() -> dict[str, Any]:
    return load_validated(rules_root() / "gpus.yaml", "gpus.schema.json")


@lru_cache(maxsize=None)
def engine_rules(name: str) -> dict[str, Any]:
    """`common`, `sglang` or `vllm` from rules/engines/."""
    path = rules_root() / "engines" / f"{name}.yaml"
    if not path.is_file():
        raise RuleError("engine rule file missing", path=str(path))
    return load_validated(path, "engine.schema.json")


@dataclass(frozen=True)
class Facts:
    """What `when` conditions are evaluated against."""

    arch: str
    quant: str
    attention: str
    moe: bool
    interconnect: str
    spec: bool
    goal: str
    model_type: str

    def matches(self, when: Mapping[str, Any]) -> bool:
        # Conditions are over config / inventory / GPU facts only, never over the name the user typed:
        # a local copy and the Hub repo of one checkpoint must get the same plan.
        for key, want in when.items():
            if key not in _CONDITION_KEYS:
                raise RuleError(f"unknown plan rule condition {key!r}; conditions are {', '.join(_CONDITION_KEYS)}",
                                path="rules/engines")
            if key in ("moe", "spec"):
                if getattr(self, key) != want:
                    return False
            elif getattr(self, key) not in want:
                return False
        return True


_CONDITION_KEYS = ("arch", "quant", "attention", "moe", "interconnect", "spec", "goal", "model_type")


def first_match(entries: list[Mapping[str, Any]], facts: Facts) -> Mapping[str, Any] | None:
    """The first entry whose `when` holds (rule files order entries most specific first)."""
    for entry in entries:
        if facts.matches(entry.get("when", {})):
            return entry
    return None
