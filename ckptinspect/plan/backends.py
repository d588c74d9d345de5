"""Pick each engine setting from its rule file: first matching `picks` entry wins.

A pick that is listed as `bad` for the same facts, or missing from the arch's `valid` list, is a
broken rule file: RuleError, caught by the rule tests rather than shipped in a command. Next to each
pick the plan shows what the engine's own `auto` resolves to on these facts (a setting's `auto`
entries, read from the engine's code) and the `alternatives` that also run here with the evidence
for switching, so a user can tell a deliberate override from the engine default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import RuleError
from ckptinspect.plan.rules import PlanFacts, engine_rule_file, engine_rules, first_match, holds


@dataclass(frozen=True)
class Choice:
    setting: str
    flag: str
    value: str | bool | None  # None: flag left out, engine default applies
    reason: str
    source: str


@dataclass(frozen=True)
class Avoid:
    flag: str
    value: str
    reason: str
    source: str


@dataclass(frozen=True)
class EngineAuto:
    """What the engine's `auto` resolves a setting to here, and what the plan passes instead (None:
    the flag is left out, so auto applies)."""

    flag: str
    value: str
    reason: str
    source: str
    plan_value: str | bool | None


@dataclass(frozen=True)
class Alternative:
    flag: str
    value: str
    reason: str
    source: str


def arch_class(engine: str, arch: str) -> str:
    classes = engine_rules(engine)["arch_classes"]
    if arch not in classes:
        raise RuleError(f"no {engine} arch class for {arch}", path=f"rules/engines/{engine}.yaml")
    return classes[arch]


def choose(engine: str, facts: PlanFacts) -> tuple[tuple[Choice, ...], tuple[Avoid, ...]]:
    rules = engine_rules(engine)
    cls = arch_class(engine, facts.arch)
    choices, avoid = [], []
    where = engine_rule_file(engine)
    for name, setting in rules["settings"].items():
        if not holds(setting.get("applies", {}), facts, source=where):
            continue
        pick = first_match(setting["picks"], facts, source=where)
        if pick is None:
            continue
        bad_here = [b for b in setting.get("bad", []) if holds(b["when"], facts, source=where)]
        value = pick["value"]
        _check_pick(engine, name, value, bad_here, setting.get("valid", {}).get(cls))
        choices.append(Choice(name, setting["flag"], value, pick["reason"], pick["source"]))
        avoid.extend(Avoid(setting["flag"], b["value"], b["reason"], b["source"]) for b in bad_here)
    return tuple(choices), tuple(avoid)


def _check_pick(engine: str, name: str, value: Any, bad: list[Mapping[str, Any]], valid: list[str] | None) -> None:
    if value is None or isinstance(value, bool):
        return
    if any(b["value"] == value for b in bad):
        raise RuleError(f"{name}: pick {value!r} is also listed as known-bad", path=f"rules/engines/{engine}.yaml")
    if valid is not None and value not in valid:
        raise RuleError(f"{name}: pick {value!r} is not in the valid list {valid}", path=f"rules/engines/{engine}.yaml")


def engine_auto(engine: str, facts: PlanFacts, choices: tuple[Choice, ...]
                ) -> tuple[tuple[EngineAuto, ...], tuple[Alternative, ...]]:
    """Each applicable setting's engine-side auto resolution and its alternatives on these facts."""
    where = engine_rule_file(engine)
    picked = {c.setting: c.value for c in choices}
    autos, alts = [], []
    for name, setting in engine_rules(engine)["settings"].items():
        if not holds(setting.get("applies", {}), facts, source=where):
            continue
        auto = first_match(setting.get("auto", []), facts, source=where)
        if auto is not None:
            autos.append(EngineAuto(setting["flag"], auto["value"], auto["reason"], auto["source"], picked.get(name)))
        alts.extend(Alternative(setting["flag"], a["value"], a["reason"], a["source"])
                    for a in setting.get("alternatives", []) if holds(a["when"], facts, source=where)
                    and a["value"] != picked.get(name))
    return tuple(autos), tuple(alts)


def resolved_value(engine: str, setting: str, facts: PlanFacts, choices: tuple[Choice, ...]) -> str | None:
    """The value the engine runs with: the plan's pick, else what its auto resolves to (None: unknown)."""
    pick = next((c.value for c in choices if c.setting == setting), None)
    if pick is not None:
        return str(pick)
    rule = engine_rules(engine)["settings"].get(setting, {})
    auto = first_match(rule.get("auto", []), facts, source=engine_rule_file(engine))
    return auto["value"] if auto else None


def env_for(engine: str, facts: PlanFacts) -> tuple[tuple[str, str, str, str], ...]:
    """(name, value, reason, source) of every environment variable whose rule holds."""
    return tuple((e["name"], e["value"], e["reason"], e["source"])
                 for e in engine_rules(engine).get("env", [])
                 if holds(e["when"], facts, source=engine_rule_file(engine)))


def parsers_for(engine: str, facts: PlanFacts) -> Mapping[str, Any] | None:
    return first_match(engine_rules(engine)["parsers"], facts, source=engine_rule_file(engine))
