"""Rule files: schema validation, error messages, extends / override semantics, family matching,
and the `ckptinspect rules` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from ckptinspect.errors import RuleError
from ckptinspect.inventory.mtp_prefix import assign_mtp, check_template, compile_prefixes
from ckptinspect.readiness import GENERIC_MTP_PREFIXES, load_rules
import ckptinspect.readiness.conditions  # noqa: F401  (registers the family conditions)
from ckptinspect.rules.conditions import condition_keys
from ckptinspect.readiness.loader import builtin_dir
from ckptinspect.rules.documents import schema_path
from ckptinspect.readiness.versions import in_range, representative
from toy_inputs import TOY_FAMILY_RULE

REPO = Path(__file__).resolve().parent.parent
FAMILIES = {
    "deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "qwen3_next", "qwen3_5",
    "qwen3_5_moe", "mimo", "mimo_v2", "ernie4_5_moe", "longcat_flash", "step3p5", "nemotron_h", "bailing_moe",
    "minimax_m2", "gpt_oss", "llama", "qwen3", "qwen3_moe", "kimi_k2_5",
    # 2026 families, part A
    "deepseek_v4", "deepseek_v41", "glm5_next", "glm_ocr", "kimi_k3", "qwen4_exp", "intern_s2", "interns2_mobius",
}
# issue 10 §3, part B (tests/test_families_2026_b.py)
FAMILIES |= {"hy_v3", "hy_v4", "minimax_m3", "exaone_moe", "exaone4_5", "pangu_ultra_moe", "dots3_note", "inkling",
             "gemma4", "gemma4_assistant", "mimo_v2_omni", "nemotron_h_omni", "bailing_moe_v3", "longcat_flash_ngram"}
# issue 20 §5 (tests/test_families_2026_c.py)
FAMILIES |= {"gigachat35", "iquest_q1", "iquest_q1_mtp", "deepseek_v4_dspark", "deepseek_v41_dspark"}
# issue 20 §5, vLLM-only drafts (tests/test_families_2026_d.py)
FAMILIES |= {"step5", "nemotron_parse35"}
# issue 31 item 5, vLLM 0.34.0's new drafts (tests/test_families_2026_e.py, tests/test_draft_subfolders.py)
FAMILIES |= {"nemotron3_5_transcribe", "minimax_m3_dspark", "kimi_k31", "mistral_large4"}
MINIMAL = TOY_FAMILY_RULE


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.fixture(autouse=True)
def private_rule_cache(tmp_path, monkeypatch):
    """Each test gets its own cache directory (never the user's ~/.cache): nothing may be written there."""
    monkeypatch.setenv("CKPTINSPECT_CACHE_DIR", str(tmp_path / "cache"))


def write_rule(directory: Path, doc: dict, name: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name or doc['id']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class FakeConfig:
    """Just the attributes RuleSet.match reads (a ModelConfig needs the whole normaliser)."""

    def __init__(self, arch: str, model_type: str, text_model_type: str | None = None) -> None:
        self.architecture, self.model_type, self.text_model_type = arch, model_type, text_model_type
        self.raw = {"architectures": [arch], "model_type": model_type}


def test_builtin_families_load_and_cover_the_issue_list():
    ruleset = load_rules()
    assert {f.id for f in ruleset.concrete()} == FAMILIES
    for fam in ruleset.concrete():
        assert set(fam.engines) == {"sglang", "vllm"}, fam.id
        assert fam.engines["sglang"].version == "0.5.23" and fam.engines["vllm"].version == "0.34.0"
        if fam.mtp.supported:
            assert fam.mtp_prefixes and fam.mtp.base, fam.id
        else:
            assert fam.mtp_prefixes == ()


def test_every_builtin_file_passes_the_schema_directly():
    import jsonschema

    schema = json.loads(schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for path in sorted(builtin_dir().glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_schema_condition_vocabulary_matches_the_evaluator():
    schema = json.loads(schema_path().read_text())
    assert set(schema["$defs"]["condition"]["properties"]) == condition_keys("family")


def test_rules_reference_their_sources():
    ruleset = load_rules()
    for fam in ruleset.families:
        for engine in fam.engines.values():
            for defect in engine.defects:
                assert defect.reference, f"{fam.id}/{engine.engine}/{defect.code} has no reference"


@pytest.mark.parametrize("arch,model_type,text_type,expected", [
    ("DeepseekV3ForCausalLM", "deepseek_v3", None, "deepseek_v3"),
    ("DeepseekV3ForCausalLM", "kimi_k2", None, "deepseek_v3"),  # Kimi-K2 reuses the architecture
    ("KimiK25ForConditionalGeneration", "kimi_k25", "kimi_k2", "kimi_k2_5"),  # arch beats nested model_type
    ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_moe"),
    ("SomeWrapperForConditionalGeneration", "wrapper", "qwen3_5_moe_text", "qwen3_5_moe"),  # nested text_config
    ("Qwen3_5ForConditionalGeneration", "qwen3_5", "qwen3_5_text", "qwen3_5"),
    ("GlmMoeDsaForCausalLM", "glm_moe_dsa", None, "glm_moe_dsa"),
    ("Glm4MoeLiteForCausalLM", "glm4_moe_lite", None, "glm4_moe_lite"),
    ("MistralForCausalLM", "mistral", None, None),
])
def test_family_matching(arch, model_type, text_type, expected):
    fam = load_rules().match(FakeConfig(arch, model_type, text_type))
    assert (fam.id if fam else None) == expected


def test_inheritance_merges_and_does_not_inherit_match():
    ruleset = load_rules()
    dsa = ruleset.get("glm_moe_dsa")
    assert dsa.extends == "deepseek_v32"
    assert dsa.architectures == ("GlmMoeDsaForCausalLM",)
    assert "self_attn.indexer" in {r.label for r in dsa.mtp.required}  # from deepseek_v32
    codes = {d.code for d in dsa.engines["vllm"].defects}
    assert {"mtp-declared-but-absent", "mtp-bf16-not-excluded"} <= codes  # from deepseek_v3 / mtp_common
    vllm_absent = [d for d in dsa.engines["vllm"].defects if d.code == "mtp-declared-but-absent"]
    # deepseek_v3 replaced the common entry by code, with one entry per vLLM behaviour
    assert [(d.versions, "ValueError" in d.message) for d in vllm_absent] == [("<0.34", True), (">=0.34", False)]
    # SG:configs/model_config.py _config_draft_model (0.5.23) rewrites GlmMoeDsaForCausalLM to its own
    # DeepSeek-NextN subclass, overriding the inherited draft class (test_families_2026_c reads that function)
    assert dsa.engines["sglang"].draft_architecture == "GlmMoeDsaForCausalLMNextN"
    assert ruleset.get("deepseek_v32").engines["sglang"].draft_architecture == "DeepseekV3ForCausalLMNextN"
    mimo_v2 = ruleset.get("mimo_v2")
    assert "mtp-extra-layers-unused" not in {d.code for d in mimo_v2.engines["sglang"].defects}
    assert "mtp-extra-layers-unused" in {d.code for d in mimo_v2.engines["vllm"].defects}


def test_user_rules_override_builtins_by_id(tmp_path):
    doc = {**MINIMAL, "id": "deepseek_v3", "name": "Patched DeepSeek",
           "match": {"architectures": ["DeepseekV3ForCausalLM"]}}
    write_rule(tmp_path, doc)
    ruleset = load_rules([tmp_path])
    fam = ruleset.get("deepseek_v3")
    assert fam.name == "Patched DeepSeek" and fam.origin == 1
    assert ruleset.match(FakeConfig("DeepseekV3ForCausalLM", "deepseek_v3")).name == "Patched DeepSeek"
    # families extending the overridden id now inherit from the user's version
    v32 = ruleset.get("deepseek_v32")
    assert v32.mtp.depth_keys == ("num_nextn_predict_layers",) and v32.mtp.experts is None
    assert load_rules().get("deepseek_v32").mtp.depth_keys == ("num_nextn_predict_layers", "num_mtp_layers")


def test_user_family_with_new_id_wins_the_match(tmp_path):
    write_rule(tmp_path, {**MINIMAL, "match": {"architectures": ["Glm4MoeForCausalLM"]}})
    ruleset = load_rules([tmp_path])
    assert ruleset.match(FakeConfig("Glm4MoeForCausalLM", "glm4_moe")).id == "toy"
    assert ruleset.get("glm4_moe") is not None


@pytest.mark.parametrize("mutate,path_part,message_part", [
    (lambda d: d["engines"]["sglang"].update(layer_use="every_step"), "$.engines.sglang.layer_use", "every_step"),
    (lambda d: d["mtp"].update(prefixes=["model.layers.{N}."]), "$.mtp.prefixes[0]",
     "'model.layers.{N}.' uses a placeholder other than {L}, {k}, {L+k}, {*}"),
    (lambda d: d["engines"]["vllm"].update(defects=[{"code": "x", "when": {"no_such_condition": True},
                                                      "verdict": "unusable", "message": "m"}]),
     "$.engines.vllm.defects[0].when", "no_such_condition"),
    (lambda d: d["engines"]["vllm"].update(defects=[{"code": "x", "when": {"mtp_absent": True},
                                                      "verdict": "broken", "message": "m"}]),
     "$.engines.vllm.defects[0].verdict", "broken"),
    (lambda d: d.pop("name"), "$", "'name' is a required property"),
    (lambda d: d["mtp"].update(required=[{"any_of": ["only_one"]}]), "$.mtp.required[0]", ""),
])
def test_schema_errors_name_file_path_and_message(tmp_path, mutate, path_part, message_part):
    doc = json.loads(json.dumps(MINIMAL))
    mutate(doc)
    path = write_rule(tmp_path, doc)
    with pytest.raises(RuleError) as info:
        load_rules([tmp_path])
    text = str(info.value)
    assert text.startswith(str(path) + ": ")
    assert path_part in text
    assert message_part in text


def test_semantic_errors_are_raised_not_dropped(tmp_path):
    bad_extends = write_rule(tmp_path / "a", {**MINIMAL, "extends": "no_such_family"})
    with pytest.raises(RuleError, match=r"\$\.extends: unknown family 'no_such_family'") as info:
        load_rules([tmp_path / "a"])
    assert str(bad_extends) in str(info.value)
    write_rule(tmp_path / "b", MINIMAL)
    write_rule(tmp_path / "b", {**MINIMAL, "id": "toy2"})
    with pytest.raises(RuleError, match="architecture 'ToyForCausalLM' is also claimed by family 'toy'"):
        load_rules([tmp_path / "b"])
    # match.config_keys_any: alone it would claim any config that sets the key, next to an architecture it
    # tells two rules of one architecture apart (DeepSeek-V4 and V4 with a bundled DSpark draft)
    write_rule(tmp_path / "k", {**MINIMAL, "id": "toy3", "match": {"config_keys_any": ["toy_draft"]}})
    with pytest.raises(RuleError, match=r"\$\.match\.config_keys_any: needs architectures or model_types"):
        load_rules([tmp_path / "k"])
    write_rule(tmp_path / "m", MINIMAL)
    write_rule(tmp_path / "m", {**MINIMAL, "id": "toy_keyed", "match": {**MINIMAL["match"], "config_keys_any": ["toy_draft"]}})
    rules = load_rules([tmp_path / "m"])
    from ckptinspect.config.normalize import normalize_config  # the pipeline's own config reader

    base = {"architectures": ["ToyForCausalLM"], "model_type": "toy", "num_hidden_layers": 2, "hidden_size": 64,
            "vocab_size": 128, "num_attention_heads": 2}
    plain, keyed, nulled = (normalize_config({**base, **extra}) for extra in ({}, {"toy_draft": 1}, {"toy_draft": None}))
    nested = normalize_config({"architectures": ["ToyForCausalLM"], "model_type": "toy_vl",
                               "text_config": {**base, "toy_draft": 2}})
    assert [rules.match(c).id for c in (plain, keyed, nulled, nested)] == ["toy", "toy_keyed", "toy", "toy_keyed"]
    no_engine = {k: v for k, v in MINIMAL.items() if k not in ("engines", "extends")}  # nothing to inherit
    no_engine["engines"] = {"sglang": MINIMAL["engines"]["sglang"]}
    write_rule(tmp_path / "c", no_engine)
    with pytest.raises(RuleError, match="missing engine section"):
        load_rules([tmp_path / "c"])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "broken.yaml").write_text("id: [unclosed\n")
    with pytest.raises(RuleError, match=r"broken\.yaml: line \d+, column \d+: invalid YAML"):
        load_rules([tmp_path / "d"])
    cyc = tmp_path / "e"
    write_rule(cyc, {**MINIMAL, "id": "x1", "extends": "x2", "match": {}})
    write_rule(cyc, {**MINIMAL, "id": "x2", "extends": "x1", "match": {}})
    with pytest.raises(RuleError, match="cycle"):
        load_rules([cyc])


def test_missing_rules_dir_is_an_error(tmp_path):
    with pytest.raises(RuleError, match="rules directory not found"):
        load_rules([tmp_path / "nope"])


def test_templates_grammar():
    assert check_template("model.layers.{L+k}.") is None
    assert "unknown placeholder" in check_template("model.layers.{N}.")
    assert "twice" in check_template("mtp.{k}.layers.{L+k}.")
    prefixes = compile_prefixes(GENERIC_MTP_PREFIXES, 61)  # what the inventory matches group patterns with
    assert assign_mtp("model.layers.{}.enorm.weight", 61, prefixes, 61) == 0
    assert assign_mtp("model.layers.{}.eh_proj.weight", 62, prefixes, 61) == 1
    assert assign_mtp("model.layers.{}.mlp.gate.weight", 60, prefixes, 61) is None
    assert assign_mtp("mtp.layers.{}.mlp.gate.weight", 2, prefixes, 61) == 2
    assert assign_mtp("mtp.fc.weight", None, prefixes, 61) == 0
    assert assign_mtp("model.mtp_emb_norm.{}.weight", 0, prefixes, 61) == 0
    assert assign_mtp("lm_head.weight", None, prefixes, 61) is None
    assert assign_mtp("model.layers.{}.mtp.x", 7, compile_prefixes(("model.layers.{*}.mtp.",), 4), 4) == 0


def test_bad_template_is_refused_when_the_rule_loads(tmp_path):
    src = (builtin_dir() / "deepseek_v3.yaml").read_text()
    bad = src.replace('"model.layers.{L+k}."', '"model.layers.{L+k}.mtp.{k}."', 1)
    assert bad != src
    (tmp_path / "deepseek_v3.yaml").write_text(bad.replace("id: deepseek_v3", "id: deepseek_v3_bad"))
    with pytest.raises(RuleError, match=r"\$\.mtp\.prefixes\[0\]: .*captures it twice"):
        load_rules([tmp_path])


def test_version_ranges():
    assert in_range("0.32.1", "<0.33") and not in_range("0.33.0", "<0.33")
    assert in_range("0.33.0rc1", ">=0.33") and in_range("0.5.23", ">=0.5.10, <0.6")
    assert not in_range("0.6.0", ">=0.5.10, <0.6")
    assert in_range(representative("<0.33"), "<0.33")
    assert in_range(representative(">=0.34, <0.35"), ">=0.34, <0.35")


def test_cli_list_show_validate(tmp_path):
    out = run_cli("rules", "list", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in json.loads(out.stdout)["families"]}
    assert set(rows) == FAMILIES
    assert rows["qwen3_5_moe"]["vllm"] == "Qwen3_5MoeMTP" and rows["minimax_m2"]["sglang"] is None
    text = run_cli("rules", "list")
    assert text.returncode == 0 and "deepseek_v3" in text.stdout and "DeepseekV3ForCausalLMNextN" in text.stdout

    show = run_cli("rules", "show", "glm_moe_dsa")
    assert show.returncode == 0, show.stderr
    doc = yaml.safe_load(show.stdout)
    assert doc["id"] == "glm_moe_dsa" and doc["match"]["architectures"] == ["GlmMoeDsaForCausalLM"]
    assert "self_attn.indexer" in doc["mtp"]["required"]
    missing = run_cli("rules", "show", "nope")
    assert missing.returncode == 2 and "unknown family 'nope'" in missing.stderr

    good = write_rule(tmp_path / "good", MINIMAL)
    ok = run_cli("rules", "validate", str(good))
    assert ok.returncode == 0 and ok.stdout.strip() == f"ok: {good}"
    bad_doc = json.loads(json.dumps(MINIMAL))
    bad_doc["engines"]["vllm"]["layer_use"] = "sometimes"
    bad = write_rule(tmp_path / "bad", bad_doc)
    res = run_cli("rules", "validate", str(good), str(bad))
    assert res.returncode == 2
    assert "ok:" in res.stdout
    assert f"{bad}: $.engines.vllm.layer_use: 'sometimes' is not one of" in res.stderr

    with_dir = run_cli("rules", "--rules-dir", str(tmp_path / "good"), "list", "--format", "json")
    assert "toy" in {r["id"] for r in json.loads(with_dir.stdout)["families"]}
    builtins = run_cli("rules", "validate", str(builtin_dir()))
    assert builtins.returncode == 0 and builtins.stdout.count("ok:") == len(list(builtin_dir().glob("*.yaml")))


def test_rule_file_documented_example_is_valid(tmp_path):
    """The full example in docs/rules_format.md must pass `rules validate` as written."""
    doc = (REPO / "docs" / "rules_format.md").read_text()
    start = doc.index("```yaml\n# example: my-rules/families/toy_mtp.yaml") + len("```yaml\n")
    example = doc[start:doc.index("```", start)]
    path = tmp_path / "toy_mtp.yaml"
    path.write_text(textwrap.dedent(example))
    res = run_cli("rules", "validate", str(path))
    assert res.returncode == 0, res.stderr


def test_edited_user_rule_files_are_validated_again(tmp_path):
    path = write_rule(tmp_path / "user", MINIMAL)
    assert load_rules([tmp_path / "user"]).get("toy") is not None
    broken = json.loads(json.dumps(MINIMAL))
    broken["engines"]["vllm"]["layer_use"] = "often"
    write_rule(tmp_path / "user", broken)
    with pytest.raises(RuleError, match=r"\$\.engines\.vllm\.layer_use"):
        load_rules([tmp_path / "user"])
    write_rule(tmp_path / "user", MINIMAL)
    assert load_rules([tmp_path / "user"]).get("toy").name == "Toy"
    assert path.exists() and not (tmp_path / "cache").exists()  # no validation cache is written


def test_builtin_load_skips_jsonschema(tmp_path):
    """The built-ins are validated in CI (test_every_builtin_file_passes_the_schema_directly), not on every
    run: loading only them never imports jsonschema; a user's file is validated (imports it)."""
    code = ("import sys; from ckptinspect.readiness import load_rules; rs = load_rules(sys.argv[1:]); "
            "print(len(rs.families), 'jsonschema' in sys.modules)")
    builtin = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    count = len(list(builtin_dir().glob("*.yaml")))
    assert builtin.stdout.split() == [str(count), "False"], builtin.stderr
    write_rule(tmp_path / "user", MINIMAL)
    user = subprocess.run([sys.executable, "-c", code, str(tmp_path / "user")], capture_output=True, text=True,
                          cwd=REPO)
    assert user.stdout.split() == [str(count + 1), "True"], user.stderr


def test_no_family_specific_python():
    """Rules are data: no family id or architecture name appears in the readiness code."""
    ruleset = load_rules()
    names = {f.id for f in ruleset.concrete()} | {a for f in ruleset.concrete() for a in f.architectures}
    names -= {"qwen3", "llama", "mimo"}  # too generic as substrings of words / comments
    source = "\n".join(p.read_text() for p in (REPO / "ckptinspect" / "readiness").glob("*.py"))
    offenders = sorted(n for n in names if n in source)
    assert offenders == []


def test_cli_show_json_includes_inherited_defects():
    res = run_cli("rules", "show", "qwen3_5", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["extends"] == "qwen3_5_moe" and doc["source"].endswith("qwen3_5.yaml")
    vllm = doc["rule"]["engines"]["vllm"]
    assert vllm["draft_architecture"] == "Qwen3_5MTP"
    assert vllm["forced_unquantized"][0]["modules"] == ["fc"]  # inherited from qwen3_5_moe
    assert "mtp-declared-but-absent" in {d["code"] for d in vllm["defects"]}  # inherited from mtp_common
    assert doc["rule"]["mtp"]["experts"] is None


def test_cli_validate_directory_with_internal_extends(tmp_path):
    base = {**MINIMAL, "id": "toy_base", "abstract": True, "match": {}}
    child = {"schema_version": 1, "id": "toy_child", "name": "Toy child", "extends": "toy_base",
             "match": {"architectures": ["ToyChildForCausalLM"]}}
    write_rule(tmp_path / "d", base)
    write_rule(tmp_path / "d", child)
    res = run_cli("rules", "validate", str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("ok:") == 2
    alone = run_cli("rules", "validate", str(tmp_path / "d" / "toy_child.yaml"))
    assert alone.returncode == 2 and "$.extends: unknown family 'toy_base'" in alone.stderr
    with_dir = run_cli("rules", "--rules-dir", str(tmp_path / "d"), "validate", str(tmp_path / "d" / "toy_child.yaml"))
    assert with_dir.returncode == 0, with_dir.stderr
