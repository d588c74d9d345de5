"""The plan rule files (rules/gpus.yaml, rules/engines/*.yaml) and their `when` conditions.

Rules are data: files are read and schema-checked by ckptinspect/rules (the one loader and validator of
every rule file); this module holds the plan's view of them and registers the plan's `when`
conditions (kind ``plan``) in the one condition registry, ckptinspect/rules/conditions.py, which
evaluates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from ckptinspect.errors import RuleError
from ckptinspect.rules.conditions import evaluate, register_all
from ckptinspect.rules.documents import load_rule_document, rules_root


@lru_cache(maxsize=None)
def gpu_rules() -> dict[str, Any]:
    return load_rule_document(rules_root() / "gpus.yaml", "gpus.schema.json", builtin=True)


@lru_cache(maxsize=None)
def engine_rules(name: str) -> dict[str, Any]:
    """`common`, `sglang` or `vllm` from rules/engines/."""
    path = rules_root() / "engines" / f"{name}.yaml"
    if not path.is_file():
        raise RuleError("engine rule file missing", path=str(path))
    return load_rule_document(path, "engine.schema.json", builtin=True)


@dataclass(frozen=True)
class PlanFacts:
    """What the `when` conditions of plan rule files are evaluated against (condition kind ``plan``).

    Config / inventory / GPU facts only, never the name the user typed: a local copy and the Hub repo
    of one checkpoint must get the same plan.
    """

    arch: str
    quant: str
    attention: str
    moe: bool
    interconnect: str
    spec: bool
    goal: str
    model_type: str


CONDITION_KIND = "plan"


def _member_of(field: str) -> Callable[[PlanFacts, Any], bool]:
    return lambda facts, want: getattr(facts, field) in want


def _equals(field: str) -> Callable[[PlanFacts, Any], bool]:
    return lambda facts, want: getattr(facts, field) == want


register_all(CONDITION_KIND, {
    **{field: _member_of(field) for field in ("arch", "quant", "attention", "interconnect", "goal", "model_type")},
    **{field: _equals(field) for field in ("moe", "spec")},
})


def engine_rule_file(name: str) -> str:
    """How errors name the engine rule file rules/engines/{name}.yaml."""
    return f"rules/engines/{name}.yaml"


def holds(when: Mapping[str, Any] | None, facts: PlanFacts, *, source: str | None = None) -> bool:
    """Whether a plan rule's ``when`` holds (an absent one always holds); ``source`` names the rule file
    for an unknown condition."""
    return evaluate(when, facts, CONDITION_KIND, source=source)


def first_match(entries: list[Mapping[str, Any]], facts: PlanFacts, *, source: str | None = None
                ) -> Mapping[str, Any] | None:
    """The first entry whose `when` holds (rule files order entries most specific first); ``source``
    names the rule file for an unknown condition."""
    for entry in entries:
        if holds(entry.get("when", {}), facts, source=source):
            return entry
    return None
