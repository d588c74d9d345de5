"""rules/quant/*.yaml: the shipped files pass their JSON Schema, and the run-time check
(readiness/module_quant.py, which spares `report` the jsonschema import) refuses what the schema
refuses."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from ckptinspect.errors import RuleError
from ckptinspect.readiness.module_quant import check, module_quant_rules
from ckptinspect.rules.documents import rules_root

SCHEMA = json.loads((rules_root() / "schema" / "module_quant.schema.json").read_text())


def _files():
    return sorted((rules_root() / "quant").glob("*.yaml"))


def test_shipped_files_pass_the_schema_and_the_check():
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
        check(doc, "rules/quant/sglang.yaml")


def test_procedures_enum_matches_the_evaluator():
    from ckptinspect.quant.engine_decision import PROCEDURES

    enum = SCHEMA["properties"]["methods"]["items"]["properties"]["procedure"]["enum"]
    assert set(enum) == set(PROCEDURES)
