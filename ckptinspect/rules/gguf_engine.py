"""The GGUF engine rule file (rules/engines/llamacpp.yaml): read, validated, placeholders checked.

It lives in the rules package because two stages read it: readiness (the llama.cpp verdict,
readiness/gguf_mtp.py) and plan (the llama-server flags, plan/llamacpp.py); the plan may not import
readiness.
"""

from __future__ import annotations

from functools import lru_cache
from string import Formatter
from typing import Any

from ckptinspect.errors import RuleError

# what a verdict's message / hint may name (rules/engines/llamacpp.yaml)
PLACEHOLDERS = frozenset({"arch", "declared", "companion", "lowest_type", "lowest_tensor", "missing", "version"})
ENGINE = "llamacpp"


@lru_cache(maxsize=4)
def gguf_engine_rules(engine: str = ENGINE) -> dict[str, Any]:
    """rules/engines/<engine>.yaml (the one rule loader; its schema is checked in CI), placeholders checked."""
    from ckptinspect.rules.documents import load_rule_document, rules_root

    path = rules_root() / "engines" / f"{engine}.yaml"
    doc = load_rule_document(path, "gguf_engine.schema.json", builtin=True)
    for i, rule in enumerate(doc["verdicts"]):
        for key in ("message", "hint"):
            names = {field for _, field, _, _ in Formatter().parse(rule.get(key, "")) if field is not None}
            if names - PLACEHOLDERS:
                raise RuleError(f"$.verdicts[{i}].{key} uses unknown placeholder(s) {sorted(names - PLACEHOLDERS)}; "
                                f"known: {', '.join(sorted(PLACEHOLDERS))}", path=str(path))
    return doc
