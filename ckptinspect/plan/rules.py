"""Load and validate the plan rule files (rules/gpus.yaml, rules/engines/*.yaml).

Rules are data: this module only reads them, checks them against their JSON Schemas and evaluates
`when` conditions. A file that fails its schema raises RuleError naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from ckptinspect.errors import RuleError
from ckptinspect.safe_yaml import load_rule_yaml, read_rule_bytes

_PACKAGE = Path(__file__).resolve().parent.parent


def rules_root() -> Path:
    """The wheel copy (ckptinspect/_rules) when installed, else the source tree's rules/."""
    for candidate in (_PACKAGE / "_rules", _PACKAGE.parent / "rules"):
        if (candidate / "gpus.yaml").is_file():
            return candidate
    raise RuleError("GPU catalog not found", path=str(_PACKAGE.parent / "rules" / "gpus.yaml"))


def _load_validated(path: Path, schema_name: str) -> dict[str, Any]:
    data = load_rule_yaml(read_rule_bytes(path), path)  # the one safe loader (ckptinspect/safe_yaml.py)
    schema = json.loads((rules_root() / "schema" / schema_name).read_text(encoding="utf-8"))
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise RuleError(f"fails {schema_name} at {where}: {exc.message}", path=str(path)) from exc
    return data


@lru_cache(maxsize=None)
def gpu_rules() -> dict[str, Any]:
    return _load_validated(rules_root() / "gpus.yaml", "gpus.schema.json")


@lru_cache(maxsize=None)
def engine_rules(name: str) -> dict[str, Any]:
    """`common`, `sglang` or `vllm` from rules/engines/."""
    path = rules_root() / "engines" / f"{name}.yaml"
    if not path.is_file():
        raise RuleError("engine rule file missing", path=str(path))
    return _load_validated(path, "engine.schema.json")


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
            if key in ("moe", "spec"):
                if getattr(self, key) != want:
                    return False
            elif getattr(self, key) not in want:
                return False
        return True


def first_match(entries: list[Mapping[str, Any]], facts: Facts) -> Mapping[str, Any] | None:
    """The first entry whose `when` holds (rule files order entries most specific first)."""
    for entry in entries:
        if facts.matches(entry.get("when", {})):
            return entry
    return None
