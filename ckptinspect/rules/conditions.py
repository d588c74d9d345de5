"""The one `when:` condition language of every rule file: a registry of conditions and its evaluator.

A ``when`` mapping holds condition keys and their arguments; it holds when every entry holds (AND;
an empty or absent mapping always holds). Conditions are grouped by the kind of context they are
evaluated against:

- ``family``: rules/families/*.yaml checks, defects, draft_quant, forced_unquantized, over one
  engine's view of the checkpoint (readiness/context.py ``EngineContext``; registered by
  readiness/conditions.py and readiness/quant_conditions.py);
- ``plan``: rules/engines/*.yaml picks, caps, parsers, env, notes and divisibility checks, over the
  checkpoint's config / inventory facts and the GPU (plan/rules.py ``PlanFacts``);
- ``placement``: rules/engines/common.yaml ``memory_model.placements``, over one tensor group
  (plan/memory.py);
- ``gguf``: rules/engines/llamacpp.yaml ``verdicts``, over a GGUF checkpoint's NextN head as one engine
  version sees it (readiness/gguf_conditions.py ``GgufHeadFacts``).

Conditions are over config, inventory and GPU facts only, never over the name the user typed: a local
copy and the Hub repo of one checkpoint get the same answers. The JSON Schemas list the same keys
(``CONDITION_SCHEMAS`` says where), so a typo fails ``ckptinspect rules validate``; a key that reaches
the evaluator unregistered is a RuleError naming the rule file, never a silent pass. This module
imports nothing from readiness or plan: they import it and register their conditions here.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ckptinspect.errors import RuleError

Condition = Callable[[Any, Any], bool]  # (context, argument) -> holds

# kind -> (the rule files whose `when` uses it, schema file, JSON path of the `when` object's properties)
CONDITION_SCHEMAS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "family": ("rules/families/*.yaml", "family.schema.json", ("$defs", "condition", "properties")),
    "plan": ("rules/engines/*.yaml", "engine.schema.json", ("$defs", "when", "properties")),
    "placement": ("rules/engines/common.yaml", "engine.schema.json", ("$defs", "placement_when", "properties")),
    "gguf": ("rules/engines/llamacpp.yaml", "gguf_engine.schema.json", ("$defs", "when", "properties")),
}

_REGISTRY: dict[str, dict[str, Condition]] = {kind: {} for kind in CONDITION_SCHEMAS}


def register(kind: str, key: str, fn: Condition) -> None:
    """Make ``key`` a condition of ``kind``; registering one key twice is a programming error."""
    table = _table(kind)
    if key in table and table[key] is not fn:
        raise RuleError(f"{kind} rule condition {key!r} registered twice", path="ckptinspect/rules/conditions.py")
    table[key] = fn


def register_all(kind: str, conditions: Mapping[str, Condition]) -> None:
    for key, fn in conditions.items():
        register(kind, key, fn)


def condition_keys(kind: str) -> frozenset[str]:
    """The keys ``kind``'s conditions may use (what its schema must list)."""
    return frozenset(_table(kind))


def names_used(when: Any) -> set[str]:
    """Every condition name a ``when`` mapping uses, nested under ``not`` / ``any`` included (for checks
    over rule files, e.g. readiness/loader.py per_module_problem)."""
    if not isinstance(when, Mapping):
        return set()
    names = set(when)
    for key, value in when.items():
        if key == "not":
            names |= names_used(value)
        elif key == "any" and isinstance(value, list):
            for item in value:
                names |= names_used(item)
    return names


def evaluate(when: Mapping[str, Any] | None, context: Any, kind: str, *, source: str | None = None) -> bool:
    """True when every condition of ``when`` holds for ``context``.

    ``source`` names the rule file the mapping came from (default: the files of ``kind``); an unknown
    key raises RuleError naming it and listing the known keys.
    """
    if not when:
        return True
    table = _table(kind)
    for key, arg in when.items():
        fn = table.get(key)
        if fn is None:
            raise RuleError(f"unknown {kind} rule condition {key!r}; conditions are {', '.join(sorted(table))}",
                            path=source or CONDITION_SCHEMAS[kind][0])
        if not fn(context, arg):
            return False
    return True


def _table(kind: str) -> dict[str, Condition]:
    table = _REGISTRY.get(kind)
    if table is None:
        raise RuleError(f"unknown condition kind {kind!r}; kinds are {', '.join(_REGISTRY)}",
                        path="ckptinspect/rules/conditions.py")
    return table
