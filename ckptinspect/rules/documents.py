"""The one loader of rule documents (families, engines, quantization procedures, the GPU catalog, the GGUF
engine file), their schemas and the one error form.

Every rule file is read by the safe YAML loader (ckptinspect/safe_yaml.py) and checked against its JSON
Schema in rules/schema/ the same way (``validate_document``): a user's file (--rules-dir, --gpu-spec,
``rules validate``) on every load; the package's own files are data shipped like code and validated in
CI (tests/test_rule_documents.py checks every one against its schema), so a report reads them without
importing jsonschema, through the JSON mirror of the unchanged files (ckptinspect/rules/mirror.py).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from ckptinspect.errors import RuleError
from ckptinspect.rules.mirror import builtin_rule_document
from ckptinspect.safe_yaml import load_rule_yaml, read_rule_bytes

_PACKAGE = Path(__file__).resolve().parent.parent
FAMILY_SCHEMA = "family.schema.json"


def rules_root() -> Path:
    """The built-in rules folder: the wheel copy (``ckptinspect/_rules``) if installed, else the source
    tree's ``rules/``."""
    for candidate in (_PACKAGE / "_rules", _PACKAGE.parent / "rules"):
        if (candidate / "families").is_dir() and (candidate / "gpus.yaml").is_file():
            return candidate
    raise RuleError("built-in rules not found", path=str(_PACKAGE.parent / "rules"))


def schema_path(name: str = FAMILY_SCHEMA) -> Path:
    return rules_root() / "schema" / name


@lru_cache(maxsize=None)
def validator(name: str = FAMILY_SCHEMA) -> Any:
    """The validator of one schema (jsonschema is imported here, only when a document is validated)."""
    import jsonschema

    schema = json.loads(schema_path(name).read_text(encoding="utf-8"))
    # The schemas' `pattern`s meet strings from rule files: matched on RE2 like every other untrusted
    # match (ckptinspect/safe_regex.py), not on Python's backtracking engine.
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _re2_pattern})
    return cls(schema)


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterable[Any]:
    """jsonschema's ``pattern`` keyword (``re.search`` semantics, its own message), evaluated by RE2."""
    import jsonschema

    from ckptinspect.safe_regex import search

    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def validate_document(doc: Any, path: str, schema: str = FAMILY_SCHEMA) -> None:
    """Raise RuleError for the first schema error of ``doc`` (deepest, most specific first)."""
    errors = list(validator(schema).iter_errors(doc))
    if not errors:
        return
    import jsonschema

    err = jsonschema.exceptions.best_match(errors)
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    raise RuleError(f"{_doc_path(err.absolute_path)}: {_readable(err)}{more}", path=path)


def load_rule_document(path: Path, schema: str, *, builtin: bool = False) -> Any:
    """Read one rule file through the safe loader (a built-in one through its JSON mirror while unchanged:
    ckptinspect/rules/mirror.py) and, unless it is one of the package's own files (``builtin``: validated
    in CI), validate it against ``schema``. Raises RuleError naming the file."""
    doc = builtin_rule_document(path, rules_root())
    if not builtin:
        validate_document(doc, str(path), schema)
    return doc


def parse_rule_document(data: bytes, where: str, schema: str) -> Any:
    """A user's rule document already read (by the guarded reader of its own kind of file), parsed by the
    safe loader and validated against ``schema`` as load_rule_document does."""
    doc = load_rule_yaml(data, where)
    validate_document(doc, where, schema)
    return doc


def plan_rule_schema(path: Path) -> str | None:
    """The schema of a plan rule file (``kind: engine`` / ``kind: common`` -> engine.schema.json, the GPU
    catalog -> gpus.schema.json, an engine's quantization decisions -> module_quant.schema.json, the engines'
    model registries -> engine_architectures.schema.json), or None
    for a family rule file (validated by the family loader)."""
    doc = load_rule_yaml(read_rule_bytes(path), path)
    if isinstance(doc, dict) and doc.get("kind") in ("engine", "common"):
        return "engine.schema.json"
    if isinstance(doc, dict) and doc.get("kind") == "gguf_engine":
        return "gguf_engine.schema.json"
    if isinstance(doc, dict) and doc.get("kind") == "module_quant":  # rules/quant/<engine>.yaml
        return "module_quant.schema.json"
    if isinstance(doc, dict) and doc.get("kind") == "engine_architectures":  # rules/engines/architectures.yaml
        return "engine_architectures.schema.json"
    if isinstance(doc, dict) and "gpus" in doc and "id" not in doc:
        return "gpus.schema.json"
    return None


def _doc_path(parts: Iterable[Any]) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


_PLACEHOLDERS = {"(L|k|L\\+k|\\*)": "{L}, {k}, {L+k}, {*}", "(k|e)": "{k}, {e}"}


def _readable(err: Any) -> str:
    """Schema messages, with the placeholder regexes of templates spelled out."""
    if err.validator == "pattern" and isinstance(err.instance, str):
        for fragment, allowed in _PLACEHOLDERS.items():
            if fragment in err.validator_value:
                return f"{err.instance!r} uses a placeholder other than {allowed}"
    return err.message
