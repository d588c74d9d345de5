"""The engines' per-module quantization decision rules (rules/quant/<engine>.yaml), read for `report`.

Read by the one rule loader (ckptinspect/rules/documents.py) like every built-in rule file: checked
against rules/schema/module_quant.schema.json in CI (tests/test_rule_documents.py), and by
`rules validate` when a user checks a file of their own.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from ckptinspect.rules.documents import load_rule_document, rules_root

SCHEMA = "module_quant.schema.json"


@lru_cache(maxsize=None)
def module_quant_rules(engine: str) -> Mapping[str, Any] | None:
    """rules/quant/<engine>.yaml (None when the engine has no such file)."""
    path = rules_root() / "quant" / f"{engine}.yaml"
    if not path.is_file():
        return None
    return load_rule_document(path, SCHEMA, builtin=True)
