"""rules/quant/*.yaml: the shipped files pass their JSON Schema, and the one rule loader's check
(ckptinspect/rules/documents.py validate_document, what a user's file goes through) refuses what the schema refuses,
naming the file."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from ckptinspect.errors import RuleError
from ckptinspect.readiness.module_quant import module_quant_rules
from ckptinspect.rules.documents import rules_root, validate_document

SCHEMA = json.loads((rules_root() / "schema" / "module_quant.schema.json").read_text())


def _files():
    return sorted((rules_root() / "quant").glob("*.yaml"))


def test_shipped_files_pass_the_schema():
    assert _files()
    for path in _files():
        doc = module_quant_rules(path.stem)
        jsonschema.validate(doc, SCHEMA)
        assert doc["engine"] == path.stem and doc["methods"]


MUTATIONS = [
    lambda d: d.pop("packed"),
    lambda d: d.update(kind="engine"),
    lambda d: d.update(extra=1),
    lambda d: d["methods"][0].update(procedure="guess"),
    lambda d: d["methods"][0].pop("source"),
    lambda d: d["methods"][0].update(methods=[]),
    lambda d: d["methods"][0].update(lists="ignore"),
    lambda d: d["methods"][0].update(model_prefix_variants="yes"),
    lambda d: d["methods"][0].update(surprise=True),
    lambda d: d["packed"].update(qkv_proj="q_proj"),
    lambda d: d.update(methods={}),
]


@pytest.mark.parametrize("mutate", MUTATIONS)
def test_check_refuses_what_the_schema_refuses(mutate):
    doc = copy.deepcopy(dict(module_quant_rules("sglang")))
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
    with pytest.raises(RuleError, match="sglang.yaml"):
        validate_document(doc, "rules/quant/sglang.yaml", "module_quant.schema.json")


def test_procedures_enum_matches_the_evaluator():
    from ckptinspect.quant.engine_decision import PROCEDURES

    enum = SCHEMA["properties"]["methods"]["items"]["properties"]["procedure"]["enum"]
    assert set(enum) == set(PROCEDURES)


def test_long_lists_are_answered_through_one_set():
    """Thousands of regex entries: the first matching entry in list order decides, as SGLang's loops
    do, without one compilation per entry (engine_decision._regex_set)."""
    from ckptinspect.quant.declared import read_declared
    from ckptinspect.quant.engine_decision import decide, method_rule

    section = module_quant_rules("sglang")
    many = [f"re:model\\.layers\\.{i}\\..*" for i in range(5000)]
    ct = {"quant_method": "compressed-tensors", "ignore": [*many, "re:mtp\\.layers\\..*"],
          "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}}
    declared, _ = read_declared({"quantization_config": ct}, None)
    rule = method_rule(section, "compressed-tensors")
    answer = decide(section, rule, declared, "mtp.layers.0.self_attn.o_proj", "linear")
    assert answer.built == "unquantized" and "re:mtp" in answer.why
    assert decide(section, rule, declared, "model.layers.4999.mlp.down_proj", "linear").why.endswith("4999\\\\..*'")
    dynamic = {**{f"+:model\\.layers\\.{i}\\..*": {"bits": 8} for i in range(5000)}, "-:.*": {}}
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": dynamic}
    declared, _ = read_declared({"quantization_config": gptq}, None)
    rule = method_rule(section, "gptq")
    assert decide(section, rule, declared, "model.layers.7.self_attn.o_proj", "linear").built == "quantized"
    assert decide(section, rule, declared, "mtp.fc", "linear").built == "unquantized"
