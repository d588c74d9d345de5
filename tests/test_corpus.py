"""fixtures/corpus.py stores what each release stores: a block-FP8 config's exclusion lists
(``ignored_layers`` and ``modules_to_not_convert``, the two lists the engines' Fp8Config reads) name
modules the replica writes BF16, without a ``weight_scale_inv``."""

from __future__ import annotations

import pytest

from fixtures.corpus import corpus_tensors, entries, fp8_exclusions, reduced_config


def _entry(repo: str):
    return next(e for e in entries() if e.repo == repo)


def _dtypes(tensors) -> dict[str, str]:
    return {t.name: t.dtype for t in tensors}


def test_ignored_layers_are_stored_bf16():
    """MiMo-V2-Flash's release lists its backbone o_proj in ignored_layers (fixtures/families_misc.py
    mimo_v2_flash); the corpus copy lacks the list, so it is added here as the release carries it."""
    entry = _entry("XiaomiMiMo/MiMo-V2-Flash")
    config = reduced_config(entry)
    n = config["num_hidden_layers"]
    assert "ignored_layers" not in config["quantization_config"]  # the copy, as SOURCES.md says
    before = _dtypes(corpus_tensors(entry, config))
    config["quantization_config"]["ignored_layers"] = [f"model.layers.{i}.self_attn.o_proj" for i in range(n)]
    after = _dtypes(corpus_tensors(entry, config))
    for i in range(n):
        o = f"model.layers.{i}.self_attn.o_proj"
        assert before[f"{o}.weight"] == "F8_E4M3" and f"{o}.weight_scale_inv" in before
        assert after[f"{o}.weight"] == "BF16" and f"{o}.weight_scale_inv" not in after
        assert after[f"model.layers.{i}.self_attn.q_proj.weight"] == "F8_E4M3"
    # the MTP layers' o_proj are not listed by their checkpoint name: they stay as the config gives them
    assert after["model.mtp.layers.0.self_attn.o_proj.weight"] == "F8_E4M3"


def test_both_lists_are_read_together():
    """A config carrying both lists keeps every module either names BF16 (the engines pick one list:
    vLLM 0.32.0 fp8.py:162-168, SGLang 0.5.23 fp8.py:354-356; the release stores both unquantized)."""
    entry = _entry("Qwen/Qwen3-30B-A3B-FP8")
    config = reduced_config(entry)
    qc = config["quantization_config"]
    assert "model.layers.0.mlp.gate" in qc["modules_to_not_convert"]
    qc["ignored_layers"] = ["model.layers.1.self_attn.o_proj"]
    got = _dtypes(corpus_tensors(entry, config))
    assert got["model.layers.1.self_attn.o_proj.weight"] == "BF16"
    assert got["model.layers.0.mlp.gate.weight"] == "BF16"
    assert got["model.layers.0.self_attn.o_proj.weight"] == "F8_E4M3"


def test_minimax_reads_its_lists():
    """The MiniMax-M2 layout is written by fixtures/replica_minimax.py; an FP8 list entry still decides."""
    entry = _entry("MiniMaxAI/MiniMax-M2.5")
    config = reduced_config(entry)
    plain = _dtypes(corpus_tensors(entry, config))
    assert plain["model.layers.0.self_attn.o_proj.weight"] == "F8_E4M3"
    config["quantization_config"]["ignored_layers"] = ["model.layers.0.self_attn.o_proj"]
    got = _dtypes(corpus_tensors(entry, config))
    assert got["model.layers.0.self_attn.o_proj.weight"] == "BF16"
    assert "model.layers.0.self_attn.o_proj.weight_scale_inv" not in got
    assert got["model.layers.1.self_attn.o_proj.weight"] == "F8_E4M3"


@pytest.mark.parametrize("entry, name, named", [
    ("gate", "model.layers.3.block_sparse_moe.gate", True),        # a dotted tail (MiniMax-M2.x's list)
    ("gate", "model.layers.3.mlp.gate_proj", False),               # not inside a component
    ("model.layers.0.self_attn", "model.layers.0.self_attn.q_proj", True),  # a listed parent
    ("model.layers.0.self_attn", "model.layers.10.self_attn.q_proj", False),
    ("model.layers.*.self_attn", "model.layers.7.self_attn.o_proj", True),  # an fnmatch pattern
    ("model.layers.1.mlp.gate", "model.layers.1.mlp.gate", True),
])
def test_exclusion_names(entry, name, named):
    for key in ("ignored_layers", "modules_to_not_convert"):
        assert fp8_exclusions({key: [entry]})(name) is named


def test_every_real_list_entry_naming_a_stored_linear_is_bf16():
    """Over the real corpus: a list entry that is the full name of a stored weight never names an FP8 one."""
    checked = 0
    for entry in entries():
        config = reduced_config(entry)
        qc = config.get("quantization_config") or {}
        if qc.get("quant_method") != "fp8":
            continue
        listed = {e for key in ("ignored_layers", "modules_to_not_convert") for e in (qc.get(key) or ())}
        for t in corpus_tensors(entry, config):
            if t.name.endswith(".weight") and t.name[: -len(".weight")] in listed:
                checked += 1
                assert t.dtype != "F8_E4M3", (entry.repo, t.name)
    assert checked > 0


def test_glm4_moe_qk_norm_follows_the_config():
    """zai-org/GLM-4.5 sets use_qk_norm: its replica carries self_attn.q_norm / k_norm over head_dim in every
    layer, the NextN layer included (vLLM 0.32.0 glm4_moe.py:296-298 builds them only then); without the flag
    (GLM-4.5-Air's config) none is written."""
    entry = _entry("zai-org/GLM-4.5")
    config = reduced_config(entry)
    n, hd = config["num_hidden_layers"], config["head_dim"]
    assert config["use_qk_norm"] is True
    got = {t.name: t for t in corpus_tensors(entry, config)}
    for i in (0, n - 1, n):
        assert got[f"model.layers.{i}.self_attn.q_norm.weight"].shape == (hd,)
        assert got[f"model.layers.{i}.self_attn.k_norm.weight"].shape == (hd,)
    assert got[f"model.layers.{n}.eh_proj.weight"].mtp and not got["model.layers.0.self_attn.q_proj.weight"].mtp
    config["use_qk_norm"] = False
    assert not any(".q_norm." in t.name or ".k_norm." in t.name for t in corpus_tensors(entry, config))


def test_bailing_moe_layout_follows_the_config():
    """inclusionAI/Ling-plus (BailingMoeForCausalLM): one fused query_key_value of (heads + 2 kv_heads) x
    head_dim rows, head_dim = hidden / heads when the config has none, one shared MLP of moe_intermediate_size
    x num_shared_experts, no dense layer (first_k_dense_replace 0), no qk norms, no router bias, no MTP."""
    entry = _entry("inclusionAI/Ling-plus")
    config = reduced_config(entry)
    h, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd = h // heads
    tensors = corpus_tensors(entry, config)
    got = {t.name: t.shape for t in tensors}
    assert got["model.layers.0.attention.query_key_value.weight"] == ((heads + 2 * kv) * hd, h)
    assert got["model.layers.0.mlp.shared_experts.gate_proj.weight"] == (
        config["moe_intermediate_size"] * config["num_shared_experts"], h)
    assert "model.layers.0.mlp.experts.0.up_proj.weight" in got and "model.layers.0.mlp.gate_proj.weight" not in got
    assert not any("layernorm" in n and ".attention." in n or n.endswith("expert_bias") for n in got)
    assert not any(t.mtp for t in tensors)
    config.update(first_k_dense_replace=1, use_qk_norm=True, moe_router_enable_expert_bias=True)
    got = {t.name for t in corpus_tensors(entry, config)}
    assert "model.layers.0.mlp.gate_proj.weight" in got and "model.layers.0.mlp.experts.0.up_proj.weight" not in got
    assert {"model.layers.1.attention.query_layernorm.weight", "model.layers.1.mlp.gate.expert_bias"} <= got
