"""Issue 10 §3, part B: the 2026 MTP families (HunYuan Hy3 / Hy4, MiniMax-M3, EXAONE-MoE / 4.5, openPangu
Ultra MoE, dots3 note, Inkling, Gemma-4), the corrected families (MiMo-V2 Omni, Nemotron-H Puzzle / Omni,
Bailing V3, Step-3.7 VLM, GLM-5's SGLang draft, LongCat-Flash-Ngram), the generic scan of unknown
architectures, and `rules list` showing every family with its model types.

Expected facts come from the engines' public loaders cited in each rule file, not from the rule files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ckptinspect.config.normalize import normalize_config
from ckptinspect.inventory.mtp_prefix import GENERIC_MTP_PREFIXES, assign_mtp, compile_prefixes
from ckptinspect.readiness import load_rules
from ckptinspect.readiness.loader import builtin_dir

# fixture -> family, (SGLang verdict, draft class), (vLLM verdict, draft class)
EXPECTED = {
    "hy_v3": ("hy_v3", ("ready", "HYV3ForCausalLMNextN"), ("ready", "HYV3MTPModel")),
    "hy_v3_nomtp": ("hy_v3", ("unusable", "HYV3ForCausalLMNextN"), ("unusable", "HYV3MTPModel")),
    "hy_v4": ("hy_v4", ("ready", "HYV4ForCausalLMNextN"), ("ready", "HYV4MTPModel")),
    "hy_v4_at_layer_l": ("hy_v4", ("unusable", "HYV4ForCausalLMNextN"), ("ready", "HYV4MTPModel")),
    "minimax_m3_vl": ("minimax_m3", ("unusable", None), ("ready", "MiniMaxM3MTP")),
    "minimax_m3_text": ("minimax_m3", ("unusable", None), ("ready", "MiniMaxM3MTP")),
    "exaone_moe": ("exaone_moe", ("ready", "ExaoneMoEForCausalLMMTP"), ("ready", "ExaoneMoeMTP")),
    "exaone4_5": ("exaone4_5", ("unusable", None), ("ready", "Exaone4_5_MTP")),  # no EXAONE-4.5 in SGLang 0.5.23
    "pangu_ultra_moe": ("pangu_ultra_moe", ("unusable", None), ("ready", "OpenPanguMTPModel")),
    "dots3_note": ("dots3_note", ("ready", "Dots3NoteForCausalLMNextN"), ("ready", "Dots3NoteMTPModel")),
    "inkling": ("inkling", ("ready", "InklingForConditionalGenerationMTP"), ("ready", "InklingMTPModel")),
    "inkling_nomtp": ("inkling", ("unusable", "InklingForConditionalGenerationMTP"), ("unusable", "InklingMTPModel")),
    "gemma4": ("gemma4", ("absent", None), ("absent", None)),
    # corrected families
    "mimo_v2_omni": ("mimo_v2_omni", ("unusable", None), ("degraded", "MiMoV2OmniMTPModel")),
    "nemotron_h_puzzle": ("nemotron_h", ("ready", "NemotronHForCausalLMMTP"), ("ready", "NemotronHMTPModel")),
    "nemotron_h_omni": ("nemotron_h_omni", ("ready", "NemotronHForCausalLMMTP"), ("ready", "NemotronHMTPModel")),
    "bailing_moe_v3": ("bailing_moe_v3", ("ready", "BailingMoeForCausalLMNextN"), ("ready", "BailingMoeV3MTPModel")),
    "step3p7_vl": ("step3p5", ("ready", "Step3p5MTP"), ("ready", "Step3p5MTP")),
    "glm_moe_dsa": ("glm_moe_dsa", ("ready", "GlmMoeDsaForCausalLMNextN"), ("ready", "DeepseekV32MTPModel")),
    "longcat_flash_ngram": ("longcat_flash_ngram", ("unusable", None), ("ready", "LongCatFlashMTPModel")),
    # unknown architecture: generic scan
    "unknown_mtp_top": (None, ("unusable", None), ("degraded", None)),
    "unknown_model_mtp": (None, ("unusable", None), ("degraded", None)),
    "unknown_layers_l": (None, ("unusable", None), ("degraded", None)),
}
# Where each engine's loader finds the MTP layer (the rule files are not consulted for these).
PREFIX = {
    "hy_v3": "model.layers.2.",  # SG:models/hunyuan_v3_nextn.py f"model.layers.{num_hidden_layers}."
    "hy_v4": "model.mtp_layers.0.",  # SG:models/hunyuan_v4_nextn.py keeps "model.mtp_layers.0."
    "hy_v4_at_layer_l": "model.layers.2.",  # vLLM's HY V4 loader also accepts model.layers.{L}
    "minimax_m3_vl": "language_model.model.mtp.layers.0.",  # vLLM MiniMaxM3MTP strips "language_model."
    "minimax_m3_text": "model.mtp.layers.0.",
    "exaone_moe": "mtp.", "exaone4_5": "mtp.",  # VL:.../exaone_moe_mtp.py: "mtp." -> "model."
    "pangu_ultra_moe": "model.layers.3.", "dots3_note": "model.layers.3.",
    "step3p7_vl": "model.language_model.layers.2.",  # VL:.../step3p7.py: model.language_model.
    "nemotron_h_omni": "language_model.mtp.",
    "unknown_mtp_top": "mtp.layers.0.", "unknown_model_mtp": "model.mtp.layers.0.", "unknown_layers_l": "model.layers.2.",
}


def reasons(mtp, engine: str) -> set[str]:
    return set(mtp.verdicts[engine].reasons)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdicts_per_engine(report, fixture_specs, name):
    family, (sg_verdict, sg_draft), (vl_verdict, vl_draft) = EXPECTED[name]
    r = report(name)
    mtp = r.mtp
    assert mtp.family == r.checkpoint.family == family
    sg, vl = mtp.verdicts["sglang"], mtp.verdicts["vllm"]
    assert (sg.verdict, sg.draft_architecture) == (sg_verdict, sg_draft)
    assert (vl.verdict, vl.draft_architecture) == (vl_verdict, vl_draft)
    # what the generator flagged as MTP is exactly what the assessment counted, in every family
    assert mtp.tensors == fixture_specs[name].mtp_tensors
    for v in (sg, vl):
        if v.verdict in ("unusable", "degraded"):
            assert v.reasons and {f.code for f in mtp.findings if f.engine == v.engine} >= set(v.reasons)
        if v.draft_architecture is None and mtp.present_layers:
            assert v.verdict != "ready"  # MTP shipped but the engine has no draft class: never ready
    if name in PREFIX:
        assert [layer.prefix for layer in mtp.layers][:1] == [PREFIX[name]]


def test_no_error_findings_on_complete_layouts(report):
    """A correct release layout raises no error except the engine that has no draft class for it."""
    # the one deliberate exception: SGLang's HY V4 loader does not read a layer re-keyed to model.layers.{L}
    expected_errors = {"hy_v4_at_layer_l": {("mtp-layer-not-loaded", "sglang")}}
    for name in EXPECTED:
        if name.endswith("_nomtp"):
            continue
        r = report(name)
        mtp = r.mtp
        assert all(not layer.missing for layer in mtp.layers), (name, [l.missing for l in mtp.layers])
        errors = {(f.code, f.engine) for f in (*r.checkpoint.findings, *mtp.findings) if f.severity == "error"}
        # arch-unknown-to-engine: SGLang 0.5.23 registers no model class for the target (rules/engines/architectures.yaml)
    allowed = {("engine-has-no-draft-model", "sglang"), ("arch-unknown-to-engine", "sglang")}
    assert errors <= allowed | expected_errors.get(name, set()), (name, errors)


def test_declared_but_absent_is_unusable_for_both(report):
    for name, key, depth in (("hy_v3_nomtp", "num_nextn_predict_layers", 1),
                             ("inkling_nomtp", "mtp_config.num_nextn_predict_layers", 8)):
        mtp = report(name).mtp
        assert (mtp.declared_key, mtp.declared_layers, mtp.present_layers) == (key, depth, 0)
        for engine in ("sglang", "vllm"):
            assert "mtp-declared-but-absent" in reasons(mtp, engine)


def test_hy_v4_rekeyed_to_layer_l_loads_in_vllm(report):
    """vLLM's HY V4 loader rewrites model.mtp_layers.{i}. and accepts model.layers.{L+i}. alike."""
    mtp = report("hy_v4_at_layer_l").mtp
    assert mtp.family == "hy_v4" and [layer.prefix for layer in mtp.layers] == ["model.layers.2."]
    assert (mtp.verdicts["vllm"].verdict, mtp.verdicts["vllm"].draft_architecture) == ("ready", "HYV4MTPModel")


def test_hy_v4_rekeyed_to_layer_l_is_unusable_in_sglang(report):
    """SG:models/hunyuan_v4_nextn.py keeps only names starting with model.mtp_layers.0.: a layer re-keyed to
    model.layers.{L} loads nothing there, while the released spelling is ready."""
    rekeyed = report("hy_v4_at_layer_l").mtp
    assert rekeyed.verdicts["sglang"].verdict == "unusable"
    assert reasons(rekeyed, "sglang") == {"mtp-layer-not-loaded"}
    note = next(f for f in rekeyed.findings if f.code == "mtp-layer-not-loaded")
    assert note.engine == "sglang" and "model.layers.2." in note.message and note.severity == "error"
    assert "mtp-layer-not-loaded" not in reasons(report("hy_v4").mtp, "sglang")


def test_hy_v4_both_prefixes_give_the_same_assessment(report):
    """The Hy4 release spelling (model.mtp_layers.0) and the re-keyed one (model.layers.{L}) differ only in
    names: same tensors, params, bytes, experts and verdicts."""
    a, b = report("hy_v4").mtp, report("hy_v4_at_layer_l").mtp
    assert (a.tensors, a.params, a.bytes, a.present_layers) == (b.tensors, b.params, b.bytes, b.present_layers)
    assert [(l.experts_present, l.experts_expected) for l in a.layers] == [(4, 4)] == \
           [(l.experts_present, l.experts_expected) for l in b.layers]
    assert a.verdicts["vllm"].verdict == b.verdicts["vllm"].verdict == "ready"


def test_minimax_m3_bundled_and_flat_agree_and_experts_are_counted(report):
    vl, flat = report("minimax_m3_vl").mtp, report("minimax_m3_text").mtp
    assert (vl.declared_key, flat.declared_key) == ("text_config.num_mtp_modules", "num_mtp_modules")
    assert (vl.tensors, vl.params) == (flat.tensors, flat.params)
    for mtp in (vl, flat):  # w1/w2/w3 experts: every expert of the MTP MoE is found
        assert [(l.experts_present, l.experts_expected) for l in mtp.layers] == [(4, 4)]
        assert "engine-has-no-draft-model" in reasons(mtp, "sglang")


def test_minimax_m3_vllm_builds_eh_proj_with_the_target_quant_config():
    """vLLM's MiniMax-M3 MTP layer makes eh_proj a ReplicatedLinear with quant_config, unlike the DeepSeek
    nn.Linear that _mtp_common forces unquantized."""
    fam = load_rules().get("minimax_m3")
    assert fam.engines["vllm"].forced_unquantized == ()
    assert any("eh_proj" in f.modules for f in load_rules().get("deepseek_v3").engines["vllm"].forced_unquantized)


def test_exaone4_5_has_no_sglang_draft_and_vllm_quantizes_fc():
    """SGLang 0.5.23 ships no EXAONE-4.5 model (test_families_2026_c reads its _config_draft_model); vLLM's
    ExaoneMoeMTP builds fc as a ColumnParallelLinear with the target quant_config (nothing forced)."""
    fam = load_rules().get("exaone4_5")
    assert fam.engines["sglang"].draft_architecture is None
    assert all("fc" not in f.modules for f in fam.engines["vllm"].forced_unquantized)


def test_dots3_draft_embedding_is_part_of_the_mtp_layer(report, fixture_specs):
    mtp = report("dots3_note").mtp
    assert mtp.present_layers == 1 and mtp.layers[0].tensors == fixture_specs["dots3_note"].mtp_tensors
    assert report("dots3_note").checkpoint.config.raw["mtp_layer_types"] == ["sliding_attention"]


def test_inkling_depth_from_mtp_config_and_per_step_layers(report):
    mtp = report("inkling").mtp
    assert (mtp.declared_key, mtp.declared_layers, mtp.present_layers) == ("mtp_config.num_nextn_predict_layers", 8, 8)
    assert mtp.verdicts["sglang"].layers_used == mtp.verdicts["vllm"].layers_used == 8
    assert mtp.verdicts["vllm"].draft_quantization is None  # InklingMTPLayer passes quant_config = None


def test_nemotron_h_omni_depth_is_read_from_llm_config(report):
    """The Omni wrapper nests the LM config under llm_config (SGLang NemotronH_Omni_Reasoning_V3_Config)."""
    mtp = report("nemotron_h_omni").mtp
    assert (mtp.declared_key, mtp.declared_layers, mtp.present_layers) == ("llm_config.num_nextn_predict_layers", 1, 1)
    assert report("nemotron_h_omni").checkpoint.config.num_hidden_layers == 4  # hybrid_override_pattern "ME*E"


def test_exaone4_5_depth_is_read_from_text_config(report):
    mtp = report("exaone4_5").mtp
    assert (mtp.declared_key, mtp.declared_layers) == ("text_config.num_nextn_predict_layers", 1)
    assert mtp.layers[0].experts_expected is None  # dense 4.5: no expert check


def test_gemma4_report_names_the_separate_assistant_draft(report):
    mtp = report("gemma4").mtp
    assert mtp.present_layers == 0 and not [f for f in mtp.findings if f.severity != "info"]
    notes = [f for f in mtp.findings if f.code == "separate-assistant-draft"]
    assert len(notes) == 1 and "gemma4_assistant" in notes[0].message and "Gemma4MTPModel" in notes[0].message


def test_gemma4_assistant_config_is_recognised_as_a_draft():
    """An assistant config (schema as published: Gemma4AssistantForCausalLM, nested gemma4_text) matches the
    assistant rule, which has no built-in MTP and says it is a draft."""
    raw = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
           "backbone_hidden_size": 2560, "num_centroids": 2048, "centroid_intermediate_top_k": 32,
           "text_config": {"model_type": "gemma4_text", "hidden_size": 256, "num_hidden_layers": 4,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 262144}}
    fam = load_rules().match(normalize_config(raw))
    assert fam.id == "gemma4_assistant" and not fam.mtp.supported
    assert any(c.code == "checkpoint-is-a-draft" for c in fam.checks)
    target = load_rules().match(normalize_config({**raw, "architectures": ["Gemma4ForConditionalGeneration"],
                                                  "model_type": "gemma4"}))
    assert target.id == "gemma4"


@pytest.mark.parametrize("arch,model_type,expected", [
    # corrections of issue 10 §3
    ("MiMoV2OmniForCausalLM", "mimo_v2", "mimo_v2_omni"),  # architecture beats the parent's model_type
    ("NemotronHPuzzleForCausalLM", "nemotron_h_puzzle", "nemotron_h"),
    ("NemotronH_Omni_Reasoning_V3", "whatever", "nemotron_h_omni"),
    ("NemotronH_Super_Omni_Reasoning_V3", "whatever", "nemotron_h_omni"),
    ("SomeOmniWrapper", "nemotron_h_omni", "nemotron_h_omni"),
    ("BailingMoeV3ForCausalLM", "bailing_moe", "bailing_moe_v3"),
    ("BailingMoeV3VLForConditionalGeneration", "whatever", "bailing_moe_v3"),
    ("BailingMoeV2ForCausalLM", "bailing_moe", "bailing_moe"),
    ("Step3p7ForConditionalGeneration", "step3p7", "step3p5"),
    ("LongcatFlashNgramForCausalLM", "longcat_flash_ngram", "longcat_flash_ngram"),
    ("SomethingForCausalLM", "longcat_flash_ngram", "longcat_flash_ngram"),
    # new families, by architecture and by model_type alone
    ("HYV3ForCausalLM", "hy_v3", "hy_v3"), ("X", "hy_v4", "hy_v4"), ("X", "minimax_m3_vl", "minimax_m3"),
    ("ExaoneMoeForCausalLM", "exaone_moe", "exaone_moe"), ("X", "exaone4_5", "exaone4_5"),
    ("X", "pangu_ultra_moe", "pangu_ultra_moe"), ("X", "dots3_note", "dots3_note"),
    ("Dot3NoteForCausalLM", "dots3_note", "dots3_note"),
    ("X", "inkling_mm_model", "inkling"), ("X", "gemma4_unified_assistant", "gemma4_assistant"),
])
def test_family_matching(arch, model_type, expected):
    raw = {"architectures": [arch], "model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 128}
    fam = load_rules().match(normalize_config(raw))
    assert (fam.id if fam else None) == expected


def test_corrected_draft_classes():
    rules = load_rules()
    # SG:configs/model_config.py _config_draft_model: GlmMoeDsaForCausalLM -> GlmMoeDsaForCausalLMNextN
    # (0.5.23; test_families_2026_c.py checks every family against that function's source)
    assert rules.get("glm_moe_dsa").engines["sglang"].draft_architecture == "GlmMoeDsaForCausalLMNextN"
    # VL:config/speculative.py: BailingMoeV3ForCausalLM -> BailingMoeV3MTPModel, the 2.x family keeps V25
    assert rules.get("bailing_moe_v3").engines["vllm"].draft_architecture == "BailingMoeV3MTPModel"
    assert rules.get("bailing_moe").engines["vllm"].draft_architecture == "BailingMoeV25MTPModel"
    assert "BailingMoeV3ForCausalLM" not in rules.get("bailing_moe").architectures
    assert rules.get("mimo_v2_omni").engines["vllm"].draft_architecture == "MiMoV2OmniMTPModel"
    assert "MiMoV2OmniForCausalLM" not in rules.get("mimo_v2").architectures
    # the Omni / Ngram / V3 children keep the parent's MTP layout
    for child, parent in (("mimo_v2_omni", "mimo_v2"), ("longcat_flash_ngram", "longcat_flash"),
                          ("bailing_moe_v3", "bailing_moe"), ("nemotron_h_omni", "nemotron_h")):
        assert rules.get(child).mtp.required == rules.get(parent).mtp.required
        assert set(rules.get(parent).mtp.prefixes) <= set(rules.get(child).mtp.prefixes)


@pytest.mark.parametrize("name,tensor", [
    ("mtp.layers.0.eh_proj.weight", 0), ("mtp.fc.weight", 0), ("model.mtp.layers.1.enorm.weight", 1),
    ("model.mtp.embed_tokens.weight", 0), ("model.layers.61.eh_proj.weight", 0), ("model.layers.62.enorm.weight", 1),
    ("model.mtp_layers.0.hnorm.weight", 0), ("language_model.model.mtp.layers.2.enorm.weight", 2),
    ("language_model.mtp.layers.0.enorm.weight", 0), ("model.layers.60.mlp.gate.weight", None),
    ("model.embed_tokens.weight", None), ("lm_head.weight", None),
])
def test_generic_prefixes_assign_the_mtp_index(name, tensor):
    """Unknown architectures: mtp.*, model.mtp* and model.layers.{L+k} all map to MTP layer k (L = 61)."""
    pattern = re.sub(r"\.\d+(?=\.|$)", ".{}", name)
    index = next((int(p) for p in name.split(".") if p.isdigit()), None)
    assert assign_mtp(pattern, index, compile_prefixes(GENERIC_MTP_PREFIXES, 61), 61) == tensor


def test_unknown_architecture_layouts_are_scanned_alike(report):
    """The three generic layouts on an unknown architecture: family null, one MTP layer found, the same
    tensor count, and for vLLM a degraded (not ready, not unusable) verdict naming unknown-family-mtp. SGLang
    0.5.23 registers no AcmeMoeForCausalLM and pins a transformers that has none: it cannot load the target,
    which is its one answer; vLLM's Transformers fallback is not decided (an info finding says so)."""
    mtps = [report(n).mtp for n in ("unknown_mtp_top", "unknown_model_mtp", "unknown_layers_l")]
    assert len({(m.tensors, m.params, m.bytes) for m in mtps}) == 1
    for m in mtps:
        assert m.family is None and m.present_layers == 1 and m.declared_layers == 1
        assert {c for f in m.findings for c in [f.code]} >= {"unknown-family", "unknown-family-mtp"}
        assert reasons(m, "vllm") == {"unknown-family-mtp"}
        assert reasons(m, "sglang") == {"arch-unknown-to-engine"}
        assert {f.code for f in m.findings if f.engine == "vllm" and f.severity == "info"} >= {"arch-support-not-decided"}


def _rule_documents() -> dict[str, dict]:
    """The rule files read with plain YAML (independent of the loader): id -> document."""
    return {d["id"]: d for d in (yaml.safe_load(p.read_text()) for p in sorted(Path(builtin_dir()).glob("*.yaml")))}


def test_rules_list_shows_every_family_with_its_model_types(cli):
    docs = {fid: d for fid, d in _rule_documents().items() if not d.get("abstract")}
    # one line per family: a width large enough that no renderer wraps or truncates the table
    text = cli("rules", "list", env={"COLUMNS": "4000"})
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: line for line in text.stdout.splitlines()[2:] if line.strip()}
    assert set(rows) == set(docs)
    header = text.stdout.splitlines()[0]
    assert "model types" in header
    for fid, doc in docs.items():
        for model_type in doc.get("match", {}).get("model_types", []):
            assert re.search(rf"(?<![\w]){re.escape(model_type)}(?![\w])", rows[fid]), (fid, model_type)
    js = cli("rules", "list", "--format", "json")
    import json
    by_id = {r["id"]: r for r in json.loads(js.stdout)["families"]}
    assert {fid: by_id[fid]["model_types"] for fid in docs} == \
           {fid: d.get("match", {}).get("model_types", []) for fid, d in docs.items()}
    for fid in ("hy_v3", "hy_v4", "minimax_m3", "exaone_moe", "exaone4_5", "pangu_ultra_moe", "dots3_note", "inkling",
                "gemma4", "gemma4_assistant"):
        assert fid in rows


PART_B = ("hy_v3", "hy_v4", "minimax_m3", "exaone_moe", "exaone4_5", "pangu_ultra_moe", "dots3_note", "inkling",
          "gemma4", "gemma4_assistant", "mimo_v2_omni", "nemotron_h_omni", "bailing_moe_v3", "longcat_flash_ngram")


@pytest.mark.parametrize("fid", PART_B)
def test_part_b_rules_cite_public_sources(fid):
    """Each rule names the public engine / transformers code it was read from, in its own file (not only
    inherited), and each engine with a draft class says where that class lives."""
    doc = _rule_documents()[fid]
    assert doc.get("references"), fid
    assert all(re.search(r"(SG:|VL:|huggingface/|vllm|sglang|transformers|NVIDIA|\.py)", ref) for ref in doc["references"])
    fam = load_rules().get(fid)
    for engine in fam.engines.values():
        if engine.draft_architecture is not None:
            assert engine.source, (fid, engine.engine)
