"""The GPU catalog, the parallel-split checks and the rule files as the library API exposes them
(re-exported by ``ckptinspect.api``): lookups the CLI validates options with before any checkpoint is
read. Each imports its stage only when called."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ckptinspect.errors import RuleError

if TYPE_CHECKING:
    from ckptinspect.plan import GpuSpec
    from ckptinspect.readiness.model import FamilyRule
    from ckptinspect.readiness.validate import RuleFileCheck


# -- GPU catalog and parallel splits (option checks before any checkpoint is read) -----------------
def gpus(spec_file: str | Path | None = None) -> "tuple[GpuSpec, ...]":
    """Every GPU of rules/gpus.yaml (``plan.GpuSpec``), after the entries of a user GPU file."""
    from ckptinspect.plan import load_gpus

    return tuple(load_gpus(spec_file))


def find_gpu(name: "str | GpuSpec", *, spec_file: str | Path | None = None,
             memory_gib: float | None = None) -> "GpuSpec":
    """The GPU named ``name`` (name, alias or nvidia-smi name; case / space / '_' insensitive) in the user
    GPU file ``spec_file`` or the catalog, with ``memory_gib`` GiB usable if given; PlanError if none."""
    from ckptinspect.plan import find_gpu as find

    return find(name, spec_file=spec_file, memory_gib=memory_gib)


def split_gpu_count(text: str) -> tuple[int | None, str]:
    """``"8x NVIDIA H200"`` -> ``(8, "NVIDIA H200")``; a name without a count -> ``(None, name)``."""
    from ckptinspect.plan.gpus import split_count

    return split_count(text)


def split_problem(tp: int, ep: int | None) -> str:
    """Why SGLang / vLLM refuse ``--tp tp --ep ep``, or "" when both accept it."""
    from ckptinspect.plan import split_problem as problem

    return problem(tp, ep)


# -- rule files ------------------------------------------------------------------------------------
def list_rules(rules_dirs: Sequence[Path] = (), *, include_abstract: bool = False) -> "tuple[FamilyRule, ...]":
    """The family rules (``readiness.FamilyRule``), built-ins plus ``rules_dirs``; abstract bases only
    with ``include_abstract``."""
    from ckptinspect.readiness import load_rules

    ruleset = load_rules(rules_dirs)
    return tuple(ruleset.families) if include_abstract else ruleset.concrete()


def family_rule(family: str, rules_dirs: Sequence[Path] = ()) -> "FamilyRule":
    """One family rule with everything it inherits resolved; RuleError naming the known ids if none."""
    from ckptinspect.readiness import load_rules

    ruleset = load_rules(rules_dirs)
    fam = ruleset.get(family)
    if fam is None:
        known = ", ".join(f.id for f in ruleset.concrete())
        raise RuleError(f"unknown family {family!r} (known: {known})")
    return fam


def validate_rules(paths: Sequence[Path], rules_dirs: Sequence[Path] = ()) -> "list[RuleFileCheck]":
    """Check rule files or directories of them, in order (``readiness.validate.validate_rule_files``):
    one ``RuleFileCheck(path, error)`` per file, ``error`` None when it passed."""
    from ckptinspect.readiness.validate import validate_rule_files

    return validate_rule_files(paths, rules_dirs)
