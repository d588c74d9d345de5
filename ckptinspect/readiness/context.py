"""What family rule conditions are evaluated against.

``Facts`` are engine-independent (computed once per checkpoint), an ``EngineContext`` is one engine at
one version. The conditions themselves (readiness/conditions.py, the structural ones;
readiness/quant_conditions.py, the quantization ones) are registered under kind ``family`` in the one
condition registry, ckptinspect/rules/conditions.py; ``holds`` asks it about a family rule's ``when``.
Modules that decide what an engine builds (draft_build.py) use ``holds`` from here, so they need not
import the conditions themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ckptinspect.readiness.layout import LayerScan
from ckptinspect.readiness.model import EngineRule, FamilyRule
from ckptinspect.records import Checkpoint, TensorGroup
from ckptinspect.rules.conditions import evaluate

CONDITION_KIND = "family"  # the registry's name for the conditions of rules/families/*.yaml


@dataclass
class Facts:
    """Engine-independent facts of one checkpoint under one family rule."""

    checkpoint: Checkpoint
    family: FamilyRule | None  # None: unknown architecture
    rule: FamilyRule  # the family, or the generic rule for unknown ones
    layers: Mapping[int, LayerScan]
    declared_key: str | None
    declared_layers: int | None
    engine_method: str | None  # quantization method name as the engines call it
    matcher: Any  # ckptinspect.quant.declared.ExcludeMatcher

    excluded_cache: dict[str, bool] = field(default_factory=dict)
    plan_cache: dict[tuple, list] = field(default_factory=dict)  # draft_build.build_plan, per build inputs
    rename_cache: dict[tuple, tuple] = field(default_factory=dict)  # draft_build._renames

    def is_excluded(self, module: str) -> bool:
        """The declared lists leave ``module`` unquantized (or declare no quantization at all)."""
        hit = self.excluded_cache.get(module)
        if hit is None:
            hit = self.excluded_cache[module] = self.matcher.is_excluded(module) is not False
        return hit

    @property
    def present(self) -> int:
        return len(self.layers)

    def mtp_groups(self) -> list[TensorGroup]:
        return [g for scan in self.layers.values() for g in scan.groups]


@dataclass
class EngineContext:
    facts: Facts
    engine: EngineRule
    version: str
    draft_quant: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def listed_sample(items: list[str], limit: int = 6) -> str:
    """The first ``limit`` items for a message, with how many more there are."""
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def holds(when: Mapping[str, Any] | None, ctx: EngineContext) -> bool:
    """Whether a family rule's ``when`` holds for ``ctx`` (an absent ``when`` always holds); an unknown
    condition is a RuleError naming the family's rule file."""
    return evaluate(when, ctx, CONDITION_KIND, source=ctx.facts.rule.source)
