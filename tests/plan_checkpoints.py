"""Checkpoint records at real scale for plan tests, built from real config values.

Configs are the published config.json values (inline, or from fixtures/data); the inventory is one
TensorGroup per projection kind (q_a_proj, kv_b_proj, k_proj, experts, ...) at the real 2-D shapes, so
the memory model's placement rules, the KV models and divisibility are evaluated at full scale
without writing 600 GB of headers.
"""

from __future__ import annotations

import json

from ckptinspect.config.normalize import normalize_config
from ckptinspect.quant.declared import read_declared
from ckptinspect.records import (Checkpoint, EngineVerdict, Inventory, MtpAssessment, TensorGroup, Totals)
from fixtures.spec import DATA_DIR

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 163840, "vocab_size": 129280,
    "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}

GLM_4_5 = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_hidden_layers": 92, "num_attention_heads": 96,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072, "vocab_size": 151552,
    "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


# GLM-5 (MLA + DSA indexer): the zai-org/GLM-5 config.json values as mirrored by jd-opensource/xllm
# xllm/models/llm/glm5.h (its defaults cite that config). The FP8 release's quantization_config is
# assumed to be the DeepSeek-style block FP8 one (128 x 128); it is not copied from zai-org/GLM-5-FP8.
GLM_5 = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 6144,
    "intermediate_size": 12288, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_hidden_layers": 78, "num_attention_heads": 64,
    "num_key_value_heads": 64, "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048,
    "max_position_embeddings": 202752, "vocab_size": 154880, "num_nextn_predict_layers": 1,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


def _mla_projections(cfg: dict) -> list[tuple[str, int, int]]:
    """(module suffix, rows, cols) of one MLA layer (q_a / kv_a are the replicated down-projections)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    out = [("q_a_proj", cfg["q_lora_rank"], h), ("q_b_proj", heads * (nope + rope), cfg["q_lora_rank"]),
           ("kv_a_proj_with_mqa", cfg["kv_lora_rank"] + rope, h),
           ("kv_b_proj", heads * (nope + v), cfg["kv_lora_rank"]), ("o_proj", h, heads * v)]
    if cfg.get("index_topk"):  # DSA indexer: query / key projections and per-head weights
        out += [("indexer.wq_b", cfg["index_n_heads"] * cfg["index_head_dim"], cfg["q_lora_rank"]),
                ("indexer.wk", cfg["index_head_dim"], h), ("indexer.weights_proj", cfg["index_n_heads"], h)]
    return out


def _gqa_projections(cfg: dict) -> list[tuple[str, int, int]]:
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    return [("q_proj", heads * d, h), ("k_proj", kv * d, h), ("v_proj", kv * d, h), ("o_proj", h, heads * d)]


def _group2(name: str, component: str, scheme: str, rows: int, cols: int, count: int, bytes_per_param: float,
            mtp: bool = False) -> TensorGroup:
    params = rows * cols * count
    return TensorGroup(pattern=name, index=None, component=component, role="weight", module=name, layer=None,
                       mtp_layer=0 if mtp else None, dtypes=("F8_E4M3",) if scheme.startswith("fp8") else ("BF16",),
                       shape=(rows, cols), tensors=count, bytes=int(params * bytes_per_param), elements=params,
                       params=params, scheme=scheme, shards=frozenset({"model.safetensors"}))


def _moe_checkpoint(ref: str, raw: dict, scheme: str = "fp8_block") -> Checkpoint:
    """Per-projection groups of a DeepSeek / GLM / Qwen MoE at its real shapes (experts in ``scheme``)."""
    config = normalize_config(raw)
    declared, _ = read_declared(raw, None)
    wb = 1 if scheme.startswith("fp8") else 2
    h, moe, n_exp = config.hidden_size, config.moe_intermediate_size, config.routed_experts
    layers = config.num_hidden_layers
    dense_layers = config.first_dense_layers
    moe_layers = layers - dense_layers
    shared = raw.get("shared_expert_intermediate_size") or moe * (raw.get("n_shared_experts") or 1)
    full = [i for i, t in enumerate(config.layer_types or ("full_attention",) * layers) if t == "full_attention"]
    linear = layers - len(full)
    attn = _mla_projections(raw) if config.attention_kind == "mla" else _gqa_projections(raw)
    groups = [
        _group2("model.embed_tokens", "embedding", "bf16", config.vocab_size, h, 1, 2),
        _group2("lm_head", "lm_head", "bf16", config.vocab_size, h, 1, 2),
        _group2("model.layers.{}.input_layernorm", "norm", "bf16", 1, h, 2 * layers, 2),
        _group2("model.layers.{}.mlp.gate", "router", "bf16", n_exp, h, moe_layers, 2),
        _group2("model.layers.{}.mlp.shared_experts", "shared_expert", scheme, 3 * shared, h, moe_layers, wb),
        _group2("model.layers.{}.mlp.experts", "routed_expert", scheme, 3 * moe, h, moe_layers * n_exp, wb),
    ]
    groups += [_group2(f"model.layers.{{}}.self_attn.{suffix}", "attention", scheme, rows, cols, len(full), wb)
               for suffix, rows, cols in attn]
    if dense_layers:
        groups.append(_group2("model.layers.{}.mlp.dense", "mlp", scheme, 3 * config.intermediate_size, h,
                              dense_layers, wb))
    if linear:  # GDN linear attention (Qwen3-Next): qkvz / ba / out projections
        t = raw
        kd, vd = t["linear_num_key_heads"] * t["linear_key_head_dim"], t["linear_num_value_heads"] * t["linear_value_head_dim"]
        groups += [_group2("model.layers.{}.linear_attn.in_proj_qkvz", "attention", scheme, 2 * kd + 2 * vd, h, linear, wb),
                   _group2("model.layers.{}.linear_attn.in_proj_ba", "attention", scheme, 2 * t["linear_num_value_heads"], h,
                           linear, wb),
                   _group2("model.layers.{}.linear_attn.out_proj", "attention", scheme, h, vd, linear, wb)]
    # One MTP layer: attention + full experts + its own (not loaded) embedding copy.
    groups += [_group2("model.layers.MTP.experts", "routed_expert", scheme, 3 * moe, h, n_exp, wb, mtp=True),
               _group2("model.layers.MTP.embed_tokens", "embedding", "bf16", config.vocab_size, h, 1, 2, mtp=True)]
    groups += [_group2(f"model.layers.MTP.self_attn.{suffix}", "attention", scheme, rows, cols, 1, wb, mtp=True)
               for suffix, rows, cols in attn]
    groups = tuple(groups)
    totals = Totals(len(groups), sum(g.params for g in groups), sum(g.bytes for g in groups))
    return Checkpoint(ref=ref, kind="hub", location=ref, files=("config.json",), config=config, declared=declared,
                      inventory=Inventory(groups, (), totals), findings=())


def deepseek_v3_fp8() -> Checkpoint:
    return _moe_checkpoint("deepseek-ai/DeepSeek-V3", DEEPSEEK_V3)


def glm_4_5_fp8() -> Checkpoint:
    return _moe_checkpoint("zai-org/GLM-4.5-FP8", GLM_4_5)


def glm_5_fp8() -> Checkpoint:
    return _moe_checkpoint("zai-org/GLM-5-FP8", GLM_5)


def qwen3_next_80b() -> Checkpoint:
    """Qwen/Qwen3-Next-80B-A3B (BF16) from its published config (fixtures/data)."""
    raw = json.loads((DATA_DIR / "Qwen__Qwen3-Next-80B-A3B-Thinking__config.json").read_text(encoding="utf-8"))
    return _moe_checkpoint("Qwen/Qwen3-Next-80B-A3B-Thinking", raw, scheme="bf16")


def mtp_ready(sglang_method: str = "EAGLE", verdict: str = "ready") -> MtpAssessment:
    verdicts = {
        "sglang": EngineVerdict("sglang", verdict, "0.5.23", "DeepseekV3ForCausalLMNextN", sglang_method, None, 1, ()),
        "vllm": EngineVerdict("vllm", verdict, "0.33.0", "DeepSeekMTPModel", "mtp", "fp8", 1, ()),
    }
    return MtpAssessment(family="test", declared_key="num_nextn_predict_layers", declared_layers=1, present_layers=1,
                         tensors=1, params=1, bytes=1, schemes={"fp8_block": 1}, complete=True, layers=(),
                         verdicts=verdicts, findings=())
