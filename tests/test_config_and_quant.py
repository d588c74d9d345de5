"""Config normalization on real config.json files, declared-quantization parsing and list semantics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptinspect.config.normalize import normalize_config
from ckptinspect.errors import ConfigError
from ckptinspect.quant.declared import ExcludeMatcher, read_declared
from ckptinspect.quant.detect import Part, detect_scheme

DATA = Path(__file__).resolve().parent.parent / "fixtures" / "data"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_qwen35_text_config_is_flattened():
    raw = _load("nvidia__Qwen3.5-397B-A17B-NVFP4__config.json")
    cfg = normalize_config(raw)
    assert cfg.text_config_path == "text_config"
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (raw["text_config"]["num_hidden_layers"],
                                                        raw["text_config"]["hidden_size"])
    assert cfg.routed_experts == raw["text_config"]["num_experts"]
    assert cfg.experts_per_token == raw["text_config"]["num_experts_per_tok"]
    assert cfg.shared_experts == 1  # shared_expert_intermediate_size > 0
    assert cfg.attention_kind == "hybrid_linear"
    assert cfg.layer_types.count("full_attention") * 4 == cfg.num_hidden_layers
    assert cfg.get("text_config.mtp_num_hidden_layers") == 1
    assert cfg.has_vision


def test_deepseek_and_dense_configs():
    ds = normalize_config(_load("deepseek-ai__DeepSeek-V3__config.json"))
    assert ds.attention_kind == "mla" and ds.routed_experts == 256 and ds.shared_experts == 1
    assert ds.first_dense_layers == 3 and ds.has_remote_code
    llama = normalize_config(_load("meta-llama__Meta-Llama-3.1-8B__config.json"))
    assert llama.routed_experts is None and llama.shared_experts is None and llama.attention_kind == "gqa"


def test_qwen3_next_layer_types_derive_from_the_interval():
    cfg = normalize_config(_load("Qwen__Qwen3-Next-80B-A3B-Thinking__config.json"))
    assert cfg.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)


def test_nemotron_h_layer_count_is_the_block_list_length():
    """nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16's config.json lists its blocks (layers_block_type) and
    carries no num_hidden_layers: the count is the list's length, as transformers' NemotronHConfig answers."""
    corpus = Path(__file__).resolve().parent.parent / "fixtures" / "data" / "corpus"
    raw = json.loads((corpus / "nvidia__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16__config.json").read_text())
    assert "num_hidden_layers" not in raw
    assert normalize_config(raw).num_hidden_layers == len(raw["layers_block_type"]) > 0
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        normalize_config({**raw, "layers_block_type": []})


@pytest.mark.parametrize("raw,message", [
    ([1, 2], "is not a JSON object"),
    ({"hidden_size": 8}, "missing 'num_hidden_layers'"),
    ({"num_hidden_layers": "sixty", "hidden_size": 8}, "'num_hidden_layers' must be an integer"),
    ({"num_hidden_layers": 2, "hidden_size": 8, "architectures": "Llama"}, "'architectures' must be a list"),
    ({"text_config": {"num_hidden_layers": 2, "hidden_size": True}}, "'text_config.hidden_size' must be an integer"),
])
def test_bad_configs(raw, message):
    with pytest.raises(ConfigError, match=message):
        normalize_config(raw)


def test_modelopt_config_and_hf_quant_config_both_read():
    cfg = _load("nvidia__Qwen3.5-397B-A17B-NVFP4__config.json")
    hq = _load("nvidia__Qwen3.5-397B-A17B-NVFP4__hf_quant_config.json")
    declared, findings = read_declared(cfg, hq)
    assert declared.label == "modelopt:NVFP4"
    assert declared.group_size == 16
    assert [e.semantics for e in declared.excludes] == ["modelopt_glob", "modelopt_glob"]
    assert len(declared.excludes[0].entries) == len(cfg["quantization_config"]["ignore"])
    assert not [f for f in findings if f.code == "exclude-lists-disagree"]  # identical in the real export


def test_hf_quant_config_only_deepseek_nvfp4():
    declared, _ = read_declared(_load("nvidia__DeepSeek-V3.1-NVFP4__config.json"),
                                _load("nvidia__DeepSeek-V3.1-NVFP4__hf_quant_config.json"))
    assert declared.label == "modelopt:NVFP4" and declared.kv_cache == "FP8"
    matcher = ExcludeMatcher(declared)
    assert matcher.is_excluded("model.layers.61.mlp.experts.3.up_proj")  # model.layers.61* (the MTP layer)
    assert matcher.is_excluded("model.layers.0.self_attn.q_a_proj")
    assert matcher.is_excluded("model.layers.0.self_attn.o_proj") is False  # quantized by omission


def test_fp8_block_and_mxfp4_labels():
    ds, _ = read_declared(_load("deepseek-ai__DeepSeek-V3__config.json"), None)
    assert ds.label == "fp8" and ds.block_size == (128, 128)
    oss, _ = read_declared(_load("openai__gpt-oss-20b__config.json"), None)
    assert oss.label == "mxfp4"
    assert ExcludeMatcher(oss).is_excluded("model.layers.7.self_attn.q_proj")  # glob model.layers.*.self_attn
    assert not ExcludeMatcher(oss).is_excluded("model.layers.7.mlp.experts.gate_up_proj")


def _declared(qc: dict) -> ExcludeMatcher:
    return ExcludeMatcher(read_declared({"quantization_config": qc}, None)[0])


def test_modelopt_prefix_wildcard_does_not_cover_mtp_fc():
    m = _declared({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["mtp.layers.0*", "lm_head"]})
    assert m.is_excluded("mtp.layers.0.mlp.experts.0.up_proj")
    assert not m.is_excluded("mtp.fc")
    assert m.is_excluded("lm_head") and not m.is_excluded("lm_head_2")


def test_compressed_tensors_re_prefix_is_match_not_fullmatch_and_plain_is_exact():
    m = _declared({"quant_method": "compressed-tensors", "ignore": ["re:mtp.*", "lm_head", "re:.*mlp.gate$"]})
    assert m.is_excluded("mtp.layers.0.self_attn.q_proj")      # re.match anchors at the start only
    assert m.is_excluded("model.layers.3.mlp.gate")
    assert not m.is_excluded("model.mtp.fc")                   # "re:mtp" does not match mid-string
    assert not m.is_excluded("lm_head.extra") and m.is_excluded("lm_head")  # plain entries are exact


def test_mixed_precision_is_an_inclusion_map():
    m = ExcludeMatcher(read_declared({}, {"quantization": {
        "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {"model.layers.0.mlp.experts.0.up_proj": {"quant_algo": "NVFP4"}}}})[0])
    assert m.declared.label == "modelopt:MIXED_PRECISION"
    assert m.is_excluded("model.layers.0.mlp.experts.0.up_proj") is False
    assert m.is_excluded("model.layers.0.self_attn.o_proj") is True


def test_gptq_dynamic_negative_rules_and_unsafe_regex_is_skipped():
    m = _declared({"quant_method": "gptq", "dynamic": {"-:.*mtp.*": {}, "+:.*": {"bits": 8}}})
    assert m.is_excluded("mtp.layers.0.mlp.down_proj") and not m.is_excluded("model.layers.0.mlp.down_proj")
    # (a+)+$ backtracks for ever in Python's engine; on RE2 (linear time) it is evaluated, with re.match's answer
    nested = _declared({"quant_method": "compressed-tensors", "ignore": ["re:(a+)+$"]})
    assert nested.findings == []
    assert nested.is_excluded("a" * 40 + "!") is False and nested.is_excluded("aaa") is True
    # what RE2 cannot evaluate (a backreference) is skipped with a finding, never run on Python's engine
    unsafe = _declared({"quant_method": "compressed-tensors", "ignore": [r"re:(a+)\1+$"]})
    assert [f.code for f in unsafe.findings] == ["exclude-entry-skipped"]
    assert unsafe.is_excluded("a" * 40 + "!") is False  # returns at once: the pattern was never run


def test_unquantized_checkpoint_declares_nothing():
    declared, findings = read_declared(_load("meta-llama__Meta-Llama-3.1-8B__config.json"), None)
    assert declared.label is None and ExcludeMatcher(declared).is_excluded("lm_head") is None and not findings


@pytest.mark.parametrize("parts,scheme", [
    ({".weight": ("U8", (8, 8)), ".weight_scale": ("F8_E4M3", (8, 1)), ".weight_scale_2": ("F32", ()),
      ".input_scale": ("F32", ())}, "nvfp4"),
    ({".weight_packed": ("U8", (8, 8)), ".weight_scale": ("F8_E4M3", (8, 1)),
      ".weight_global_scale": ("F32", (1,))}, "nvfp4"),
    ({".weight_packed": ("U8", (8, 8)), ".weight_scale": ("U8", (8, 1))}, "mxfp4"),
    ({".weight_packed": ("I32", (8, 2)), ".weight_scale": ("BF16", (8, 1))}, "int4_pack"),
    ({".weight": ("F8_E4M3", (256, 256)), ".weight_scale_inv": ("F32", (2, 2))}, "fp8_block"),
    ({".weight": ("F8_E4M3", (256, 256)), ".weight_scale": ("F32", ())}, "fp8_tensor"),
    ({".weight": ("F8_E4M3", (256, 256)), ".weight_scale": ("BF16", (256, 1))}, "fp8_channel"),
    ({".weight": ("F8_E4M3", (256, 256)), ".weight_scale": ("F32", (2, 2))}, "fp8_block"),
    ({"_blocks": ("U8", (4, 8, 2, 16)), "_scales": ("U8", (4, 8, 2))}, "mxfp4"),
    ({".qweight": ("I32", (64, 8)), ".qzeros": ("I32", (2, 8)), ".scales": ("F16", (2, 64))}, "int4_awq"),
    ({".qweight": ("I32", (8, 64)), ".qzeros": ("I32", (2, 8)), ".scales": ("F16", (2, 64)),
      ".g_idx": ("I32", (64,))}, "int4_gptq"),
    ({".weight": ("I8", (8, 8)), ".SCB": ("F32", (8,))}, "int8"),
    ({".weight": ("BF16", (8, 8))}, "bf16"),
    ({".weight": ("F32", (8,)), ".bias": ("F32", (8,))}, "fp32"),
])
def test_scheme_signatures(parts, scheme):
    built = {suffix: Part("weight", suffix, dtype, shape, 1) for suffix, (dtype, shape) in parts.items()}
    assert detect_scheme(built) == scheme


def test_encoder_decoder_wrapper_reads_its_decoder():
    """Nemotron Parse 3.5 (RadioMBartPrefixForCausalLM) keeps the LM under `decoder` with MBart names
    (d_model, decoder_layers; VL:model_executor/models/nemotron_parse3_5.py reads config.decoder.d_model); a
    top-level LM that merely has a `decoder` sub-dict keeps its own keys."""
    raw = {"architectures": ["RadioMBartPrefixForCausalLM"], "encoder": {"patch_size": 16},
           "decoder": {"d_model": 1024, "decoder_layers": 10, "vocab_size": 250027, "decoder_attention_heads": 16}}
    cfg = normalize_config(raw)
    assert (cfg.text_config_path, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("decoder", 10, 1024, 250027)
    top = normalize_config({"num_hidden_layers": 4, "hidden_size": 64, "decoder": {"num_layers": 2, "d_model": 8}})
    assert (top.text_config_path, top.num_hidden_layers, top.hidden_size) == ("", 4, 64)
