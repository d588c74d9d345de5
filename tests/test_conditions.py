"""The one `when:` language (ckptinspect/rules/conditions.py): every kind's registered keys are exactly
the keys its JSON Schema allows, an unknown key is a RuleError naming the rule file, and a typo in a
rule file fails `ckptinspect rules validate`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ckptinspect.plan.memory  # noqa: F401  (registers the placement conditions)
import ckptinspect.readiness.conditions  # noqa: F401  (registers the family conditions)
import ckptinspect.readiness.gguf_conditions  # noqa: F401  (registers the gguf conditions)
from ckptinspect.errors import RuleError
from ckptinspect.plan.rules import PlanFacts
from ckptinspect.rules.conditions import CONDITION_SCHEMAS, condition_keys, evaluate, register
from ckptinspect.rules.documents import schema_path

ROOT = Path(__file__).resolve().parent.parent
FACTS = PlanFacts(arch="sm90", quant="fp8_block", attention="mla", moe=True, interconnect="nvlink", spec=False,
                  goal="latency", model_type="deepseek_v3")


def _schema_keys(kind: str) -> set[str]:
    _, schema_file, path = CONDITION_SCHEMAS[kind]
    node = json.loads(schema_path(schema_file).read_text(encoding="utf-8"))
    for part in path:
        node = node[part]
    return set(node)


@pytest.mark.parametrize("kind", sorted(CONDITION_SCHEMAS))
def test_schema_lists_exactly_the_registered_condition_keys(kind):
    assert condition_keys(kind), kind
    assert _schema_keys(kind) == set(condition_keys(kind))


def test_every_plan_fact_is_a_condition_and_nothing_else_is():
    """The plan's facts are the condition vocabulary: no field (such as the typed model name) that no
    rule can see, and no condition over something that is not a fact."""
    assert {f.name for f in dataclasses.fields(PlanFacts)} == set(condition_keys("plan"))


@pytest.mark.parametrize("kind", sorted(CONDITION_SCHEMAS))
def test_unknown_key_is_a_rule_error_naming_the_file(kind):
    with pytest.raises(RuleError, match=f"unknown {kind} rule condition 'nmae'") as err:
        evaluate({"nmae": 1}, object(), kind)
    assert err.value.path == CONDITION_SCHEMAS[kind][0]
    with pytest.raises(RuleError) as named:
        evaluate({"nmae": 1}, object(), kind, source="my/rules.yaml")
    assert named.value.path == "my/rules.yaml"


def test_unknown_kind_and_double_registration_are_errors():
    with pytest.raises(RuleError, match="unknown condition kind"):
        evaluate({"arch": ["sm90"]}, FACTS, "plann")
    with pytest.raises(RuleError, match="registered twice"):
        register("plan", "arch", lambda facts, want: True)


def test_plan_conditions_are_an_and_over_the_facts():
    assert evaluate(None, FACTS, "plan") and evaluate({}, FACTS, "plan")
    assert evaluate({"arch": ["sm90", "sm100"], "moe": True}, FACTS, "plan")
    assert not evaluate({"arch": ["sm90"], "moe": False}, FACTS, "plan")
    assert not evaluate({"attention": ["gqa"]}, FACTS, "plan")
    assert evaluate({"spec": False, "model_type": ["deepseek_v3"]}, FACTS, "plan")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=ROOT)


def test_a_condition_typo_in_a_family_file_fails_rules_validate(tmp_path):
    rule = tmp_path / "toy_typo.yaml"
    rule.write_text(textwrap.dedent("""\
        schema_version: 1
        id: toy_typo
        name: Toy with a condition typo
        extends: mtp_common
        match: {architectures: [ToyTypoForCausalLM]}
        mtp: {prefixes: ["model.layers.{L+k}."], base: "model.layers.{L+k}."}
        checks:
          - code: toy-check
            when: {mtp_presnet: true}
            message: "typo"
        """))
    res = _cli("rules", "validate", str(rule))
    assert res.returncode == 2, res.stdout + res.stderr
    assert str(rule) in res.stderr and "mtp_presnet" in res.stderr


@pytest.mark.parametrize("where", ["pick", "placement"])
def test_a_condition_typo_in_an_engine_file_fails_rules_validate(tmp_path, where):
    """Engine rule files (kind engine / common) are checked against engine.schema.json, whose `when`
    objects allow exactly the registered plan / placement keys."""
    import yaml

    name = "sglang.yaml" if where == "pick" else "common.yaml"
    doc = yaml.safe_load((ROOT / "rules" / "engines" / name).read_text(encoding="utf-8"))
    good = tmp_path / f"good_{name}"
    good.write_text(yaml.safe_dump(doc, sort_keys=False))
    if where == "pick":
        doc["parsers"][0]["when"] = {"model_tpye": ["deepseek_v3"]}
    else:
        doc["memory_model"]["placements"][0]["when"] = {"componnet": ["embedding"]}
    bad = tmp_path / f"bad_{name}"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = _cli("rules", "validate", str(good), str(bad))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.strip() == f"ok: {good}"
    typo = "model_tpye" if where == "pick" else "componnet"
    assert res.stderr.startswith(f"invalid: {bad}: ") and typo in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["qwen3_5_moe_nvfp4", "qwen3_5_moe_mtp_fc_excluded", "deepseek_v3_nvfp4_mtp_fp4",
                                  "qwen3_5_moe_nvfp4_nomtp"])
def test_family_verdicts_never_depend_on_the_typed_name(report, name):
    """The family conditions see config and inventory facts only: the same checkpoint under another
    reference (a local copy, a renamed repo) gets the same verdicts and findings."""
    from ckptinspect.readiness import assess_mtp, load_rules

    r = report(name)
    ruleset = load_rules()
    family = ruleset.match(r.checkpoint.config)
    base = assess_mtp(r.checkpoint, family, ruleset)
    assert base == r.mtp
    for ref in ("./my-copy", "someone/Renamed-Model-NVFP4", "/models/x"):
        copy = dataclasses.replace(r.checkpoint, ref=ref, location=ref)
        assert assess_mtp(copy, family, ruleset) == base, ref


def test_an_unknown_plan_condition_names_the_engine_file_it_came_from(monkeypatch):
    """A `when` key that slipped past the schema (a rule document built in code) is a RuleError naming
    the engine file, never a pick that silently holds or fails."""
    import copy

    from ckptinspect.plan import backends
    from ckptinspect.plan.rules import engine_rules

    broken = copy.deepcopy(engine_rules("vllm"))
    broken["parsers"][0]["when"] = {"name_regex": "DeepSeek"}
    monkeypatch.setattr(backends, "engine_rules", lambda name: broken if name == "vllm" else engine_rules(name))
    with pytest.raises(RuleError, match="unknown plan rule condition 'name_regex'") as err:
        backends.parsers_for("vllm", FACTS)
    assert err.value.path == "rules/engines/vllm.yaml"
