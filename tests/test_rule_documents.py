"""The one rule-document loader (ckptinspect/rules/documents.py): every rule file the package ships passes
its JSON Schema (families, engines, the GGUF engine file, quantization procedures, the GPU catalog), which
is what lets a report read them without validating; a user's file of each kind is validated on load,
with the same error form."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptinspect.errors import RuleError
from ckptinspect.rules.documents import (FAMILY_SCHEMA, load_rule_document, parse_rule_document, plan_rule_schema,
                                         rules_root, validate_document)


def _builtin_files() -> list[Path]:
    return sorted(p for p in rules_root().rglob("*.yaml") if p.is_file())


def test_every_builtin_rule_file_passes_its_schema():
    schemas: dict[str, int] = {}
    for path in _builtin_files():
        schema = plan_rule_schema(path) or FAMILY_SCHEMA
        doc = load_rule_document(path, schema, builtin=True)
        validate_document(doc, str(path), schema)  # raises RuleError naming the file
        assert load_rule_document(path, schema) == doc  # the validating load answers the same
        schemas[schema] = schemas.get(schema, 0) + 1
    assert set(schemas) == {FAMILY_SCHEMA, "engine.schema.json", "gguf_engine.schema.json",
                            "module_quant.schema.json", "gpus.schema.json", "engine_architectures.schema.json"}
    assert schemas[FAMILY_SCHEMA] > 40


@pytest.mark.parametrize("name,schema,text,where", [
    ("family.yaml", FAMILY_SCHEMA, "id: x\nname: X\nsurprise: 1\n", "$"),
    ("sglang.yaml", "engine.schema.json", "kind: engine\nschema_version: 1\n", "$"),
    ("llamacpp.yaml", "gguf_engine.schema.json", "kind: gguf_engine\n", "$"),
    ("vllm.yaml", "module_quant.schema.json", "kind: module_quant\nschema_version: 1\nengine: vllm\n", "$"),
    ("gpus.yaml", "gpus.schema.json", "gpus: [{name: x}]\n", "$"),
    ("architectures.yaml", "engine_architectures.schema.json",
     "kind: engine_architectures\nschema_version: 1\ngenerated_by: x\nregistries: [{engine: vllm, version: '1', "
     "source: x, architectures: [Bad-Name]}]\n", "$.registries[0].architectures[0]"),
])
def test_a_user_file_of_every_kind_is_validated_with_one_error_form(tmp_path, name, schema, text, where):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RuleError) as raised:
        load_rule_document(path, schema)
    line = str(raised.value)
    assert line.startswith(f"{path}: {where}") and "\n" not in line
    with pytest.raises(RuleError) as again:
        parse_rule_document(path.read_bytes(), str(path), schema)
    assert str(again.value) == line
