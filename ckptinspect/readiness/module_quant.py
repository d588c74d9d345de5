"""The engines' per-module quantization decision rules (rules/quant/<engine>.yaml), read for `report`.

The files are small and read on every report, so they are checked here against the constraints of
rules/schema/module_quant.schema.json by hand instead of importing jsonschema (~0.2 s, more than the
rest of the rules stage); tests/test_draft_quant_rules.py validates the shipped files with the schema
and shows this check refusing what the schema refuses. A file that fails is a RuleError naming it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from ckptinspect.errors import RuleError
from ckptinspect.quant.engine_decision import PROCEDURES
from ckptinspect.rules.documents import rules_root
from ckptinspect.rules.mirror import builtin_rule_document

_TOP = {"kind", "schema_version", "engine", "packed", "packed_source", "methods", "known_methods"}
_KNOWN = {"versions", "methods", "aliases", "refusal", "unread", "source"}
_ENTRY = {"methods", "versions", "procedure", "lists", "model_prefix_variants", "note", "source"}


@lru_cache(maxsize=None)
def module_quant_rules(engine: str) -> Mapping[str, Any] | None:
    """rules/quant/<engine>.yaml, checked (None when the engine has no such file)."""
    path = rules_root() / "quant" / f"{engine}.yaml"
    if not path.is_file():
        return None
    doc = builtin_rule_document(path, rules_root())
    check(doc, str(path))
    return doc


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def check(doc: Any, path: str) -> None:
    """The schema's constraints; RuleError with the first violation."""
    def fail(where: str, why: str) -> None:
        raise RuleError(f"{where}: {why}", path=path)

    def require(mapping: dict, keys: tuple[str, ...], where: str) -> None:
        for key in keys:
            if key not in mapping:
                fail(where, f"missing '{key}'")

    if not isinstance(doc, dict):
        fail("$", "must be a mapping")
    extra = set(doc) - _TOP
    if extra:
        fail("$", f"unknown key(s) {', '.join(sorted(map(str, extra)))}")
    require(doc, ("kind", "schema_version", "engine", "packed", "methods"), "$")
    if doc["kind"] != "module_quant" or doc["schema_version"] != 1 or doc["engine"] not in ("sglang", "vllm"):
        fail("$", "kind must be module_quant, schema_version 1, engine sglang or vllm")
    if not isinstance(doc["packed"], dict) or not all(_strings(v) for v in doc["packed"].values()):
        fail("$.packed", "must map fused names to lists of shard names")
    if "packed_source" in doc and not isinstance(doc["packed_source"], str):
        fail("$.packed_source", "must be a string")
    if not isinstance(doc["methods"], list):
        fail("$.methods", "must be a list")
    for i, entry in enumerate(doc["methods"]):
        where = f"$.methods[{i}]"
        if not isinstance(entry, dict):
            fail(where, "must be a mapping")
        extra = set(entry) - _ENTRY
        if extra:
            fail(where, f"unknown key(s) {', '.join(sorted(map(str, extra)))}")
        require(entry, ("methods", "procedure", "lists", "source"), where)
        if not _strings(entry["methods"]) or not entry["methods"]:
            fail(f"{where}.methods", "must be a non-empty list of strings")
        if entry["procedure"] not in PROCEDURES:
            fail(f"{where}.procedure", f"must be one of {', '.join(sorted(PROCEDURES))}")
        if not _strings(entry["lists"]):
            fail(f"{where}.lists", "must be a list of strings")
        for key in ("versions", "note", "source"):
            if key in entry and not isinstance(entry[key], str):
                fail(f"{where}.{key}", "must be a string")
        if "model_prefix_variants" in entry and not isinstance(entry["model_prefix_variants"], bool):
            fail(f"{where}.model_prefix_variants", "must be a boolean")
    for i, entry in enumerate(doc.get("known_methods", [])):
        where = f"$.known_methods[{i}]"
        if not isinstance(entry, dict) or set(entry) - _KNOWN:
            fail(where, f"must be a mapping with keys among {', '.join(sorted(_KNOWN))}")
        require(entry, ("versions", "methods", "refusal", "source"), where)
        if not _strings(entry["methods"]) or not entry["methods"]:
            fail(f"{where}.methods", "must be a non-empty list of strings")
        for key in ("aliases", "unread"):
            value = entry.get(key, {})
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                fail(f"{where}.{key}", "must map names to strings")
