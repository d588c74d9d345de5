"""Checkpoint records at real scale for plan tests, built from real config values.

Configs are the published config.json values (copied from the serving-engine reference configs);
the inventory is a handful of TensorGroups whose byte totals follow the real shapes, so memory and
divisibility are evaluated at full scale without writing 600 GB of headers.
"""

from __future__ import annotations

from ckptinspect.config.normalize import normalize_config
from ckptinspect.quant.declared import read_declared
from ckptinspect.records import (Checkpoint, EngineVerdict, Inventory, MtpAssessment, TensorGroup, Totals)

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


def _group(name: str, component: str, scheme: str, params: int, bytes_per_param: float,
           mtp: bool = False, hidden: int = 1024) -> TensorGroup:
    # Weights are 2-D matrices (rows x hidden) as in the real checkpoints, so the memory model's
    # placement rules (1-D tensors replicated, matrices split) see the real layout.
    nbytes = int(params * bytes_per_param)
    return TensorGroup(pattern=name, index=None, component=component, role="weight", module=name, layer=None,
                       mtp_layer=0 if mtp else None, dtypes=("F8_E4M3",) if scheme.startswith("fp8") else ("BF16",),
                       shape=(max(params // hidden, 1), hidden), tensors=1, bytes=nbytes, elements=params,
                       params=params, scheme=scheme, shards=frozenset({"model.safetensors"}))


def _moe_checkpoint(ref: str, raw: dict, attn_params_per_layer: int) -> Checkpoint:
    config = normalize_config(raw)
    declared, _ = read_declared(raw, None)
    h, moe, n_exp = config.hidden_size, config.moe_intermediate_size, config.routed_experts
    dense_layers = config.first_dense_layers
    moe_layers = config.num_hidden_layers - dense_layers
    expert = 3 * h * moe
    groups = (
        _group("model.embed_tokens.weight", "embedding", "bf16", config.vocab_size * h, 2),
        _group("lm_head.weight", "lm_head", "bf16", config.vocab_size * h, 2),
        _group("model.layers.{}.self_attn", "attention", "fp8_block", attn_params_per_layer * config.num_hidden_layers, 1),
        _group("model.layers.{}.mlp.dense", "mlp", "fp8_block", dense_layers * 3 * h * config.intermediate_size, 1),
        _group("model.layers.{}.mlp.shared_experts", "shared_expert", "fp8_block", moe_layers * expert, 1),
        _group("model.layers.{}.mlp.experts", "routed_expert", "fp8_block", moe_layers * n_exp * expert, 1),
        _group("model.layers.{}.mlp.gate", "router", "bf16", moe_layers * h * n_exp, 2),
        _group("model.layers.MTP.experts", "routed_expert", "fp8_block", n_exp * expert, 1, mtp=True),
        _group("model.layers.MTP.self_attn", "attention", "fp8_block", attn_params_per_layer, 1, mtp=True),
    )
    totals = Totals(len(groups), sum(g.params for g in groups), sum(g.bytes for g in groups))
    return Checkpoint(ref=ref, kind="hub", location=ref, files=("config.json",), config=config, declared=declared,
                      inventory=Inventory(groups, (), totals), findings=())


def deepseek_v3_fp8() -> Checkpoint:
    # MLA attention: q_a, q_b, kv_a, kv_b, o projections = ~187M parameters per layer.
    return _moe_checkpoint("deepseek-ai/DeepSeek-V3", DEEPSEEK_V3, 187_000_000)


def glm_4_5_fp8() -> Checkpoint:
    # GQA 96 q heads / 8 kv heads x 128: q 5120x12288, kv 2x5120x1024, o 12288x5120.
    return _moe_checkpoint("zai-org/GLM-4.5-FP8", GLM_4_5, 5120 * 12288 * 2 + 2 * 5120 * 1024)


def mtp_ready(sglang_method: str = "EAGLE", verdict: str = "ready") -> MtpAssessment:
    verdicts = {
        "sglang": EngineVerdict("sglang", verdict, "0.5.23", "DeepseekV3ForCausalLMNextN", sglang_method, None, 1, ()),
        "vllm": EngineVerdict("vllm", verdict, "0.33.0", "DeepSeekMTPModel", "mtp", "fp8", 1, ()),
    }
    return MtpAssessment(family="test", declared_key="num_nextn_predict_layers", declared_layers=1, present_layers=1,
                         tensors=1, params=1, bytes=1, schemes={"fp8_block": 1}, complete=True, layers=(),
                         verdicts=verdicts, findings=())
