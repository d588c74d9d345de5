"""Name pattern -> role (which parameter of a module) and component (which part of the model).

Works on group patterns (``model.layers.{}.mlp.experts.{}.down_proj.weight_scale``), so it runs a few
hundred times per checkpoint, not once per tensor. The tables are generic name conventions shared by
the exporters (transformers, ModelOpt, compressed-tensors, AutoAWQ / GPTQ, gpt-oss); nothing here is
specific to one model family.
"""

from __future__ import annotations

import re

# Parameter-name suffix -> role. Longest suffixes first so "weight_scale_2" wins over "weight".
# Sources: checkpoint_formats §5 signatures (ModelOpt nvfp4_tensor.py, compressed-tensors
# compressors, AutoAWQ gemm.py, GPTQModel qlinear, openai/gpt-oss weights.py).
_ROLE_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".weight_scale_2", "scale_2"),
    (".weight_scale_inv", "scale"),
    (".weight_global_scale", "global_scale"),
    (".input_global_scale", "input_scale"),
    (".weight_zero_point", "zero_point"),
    # ModelSlim (Ascend) W8A8: weight_offset is the int8 zero point, deq_scale / quant_bias / input_offset
    # the static-activation companions (SG:layers/quantization/modelslim/schemes, sgl-project/sglang#37736)
    (".weight_offset", "zero_point"),
    (".input_offset", "input_scale"),
    (".deq_scale", "scale"),
    (".quant_bias", "other_companion"),
    (".weight_g_idx", "g_idx"),
    (".weight_packed", "weight"),
    (".weight_shape", "other_companion"),
    (".weight_scale", "scale"),
    (".input_scale", "input_scale"),
    (".pre_quant_scale", "input_scale"),
    (".k_scale", "kv_scale"),
    (".v_scale", "kv_scale"),
    (".qweight", "weight"),
    (".qzeros", "zero_point"),
    (".scales", "scale"),
    (".g_idx", "g_idx"),
    (".SCB", "scale"),
    # DeepSeek-V4 names every scale companion bare ``.scale`` (FP8 block scales and MXFP4 E8M0 scales
    # alike: "layers.0.attn.wq_a.scale", "layers.0.ffn.experts.0.w1.scale"); vLLM renames them to
    # weight_scale_inv / weight_scale at load (VL:model_executor/models/deepseek_v4_mtp.py _EXPERT_SCALE_RE).
    (".scale", "scale"),
    (".weight.absmax", "scale"),
    (".weight.quant_map", "scale"),
    (".weight.nested_absmax", "scale"),
    (".weight.nested_quant_map", "scale"),
    (".weight", "weight"),
    (".bias", "bias"),
    (".e_score_correction_bias", "bias"),
    # gpt-oss MXFP4 joins the suffix with an underscore: experts.gate_up_proj_blocks / _scales / _bias
    ("_blocks", "weight"),
    ("_scales", "scale"),
    ("_bias", "bias"),
)
# IQuest Q1 stores its fused 3-D experts as bare "experts.fc" [E, 2I, H] / "experts.proj" [E, H, I]
# (SG:models/iquest_q1.py load_iquest_q1_weights).
_BARE_WEIGHT = re.compile(r"\.experts\.(gate_up_proj|down_proj|gate_proj|up_proj|w1|w2|w3|w13|fc|proj)$")
_BNB_STATE = re.compile(r"\.weight\.quant_state\.bitsandbytes__\w+$")

# Roles whose tensors are quantization companions: counted in tensors/bytes, never in params.
COMPANION_ROLES = frozenset({"scale", "scale_2", "global_scale", "input_scale", "zero_point", "g_idx",
                             "kv_scale", "other_companion"})

# Component rules on the module pattern, first match wins.
_COMPONENT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("vision", re.compile(r"(^|\.)(visual|vision_tower|vision_model|vision_encoder|mm_projector|"
                          r"multi_modal_projector|audio_tower|vision)(\.|$)")),
    # DeepSeek-V4 has no "model." prefix: the embedding is the bare "embed", the head the bare "head".
    ("embedding", re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embeddings|embedding)$|^embed$")),
    ("lm_head", re.compile(r"(^|\.)(lm_head|shared_head\.head|shared_head\.output)$|^(output|head)$")),
    # Last segment names a norm: layernorm, q_norm, enorm / hnorm, pre_fc_norm_hidden, LongCat's enorm.m.
    ("norm", re.compile(r"(^|\.)[a-z0-9_]*norm[a-z0-9_]*$|(^|\.)(ln_f|ln_\d)$|norm\.m$")),
    # Fusion projections of the MTP input: fused eh_proj (DeepSeek-V3), split e_proj / h_proj (DeepSeek-V4,
    # VL:model_executor/models/deepseek_v4_mtp.py), Qwen's mtp.fc and Qwen4-Exp's split
    # mtp.fc_embedding / mtp.fc_hidden (VL:model_executor/models/qwen4_exp/mtp.py).
    ("mtp_fusion", re.compile(r"(^|\.)(eh_proj|e_proj|h_proj|input_proj|mtp_linear_proj(\.\{\})?)$|"
                              r"^(model\.)?mtp\.(fc|fc_embedding|fc_hidden)$")),
    ("shared_expert", re.compile(r"\.(shared_experts?|shared_mlp|shared_expert_gate)(\.|$)")),
    ("routed_expert", re.compile(r"\.(experts|local_experts)(\.|$)")),
    # DeepSeek-V4 routes in "ffn.gate" (bias in "ffn.gate.bias", hash-routed layers "ffn.gate.tid2eid").
    # A parameter of the MoE block itself is its routing bias (MiniMax-style
    # block_sparse_moe.e_score_correction_bias; DeepSeek keeps it under mlp.gate).
    # Mistral's consolidated format keeps the router beside the experts, "layers.{}.gate" (vLLM renames it
    # to mlp.gate: VL:models/mistral/mistral_large4/nvidia/model.py:313).
    ("router", re.compile(r"\.(mlp|block_sparse_moe|moe|feed_forward|ffn|mixer)\.(gate|router)$|\.router$|"
                          r"\.gate\.(e_score_correction_bias|tid2eid)$|\.(block_sparse_moe|moe)$|"
                          r"^layers\.\{\}\.gate$")),
    ("attention", re.compile(r"\.(self_attn|attention|attn|linear_attn|mixer|cross_attn)(\.|$)")),
    ("mlp", re.compile(r"\.(mlp|feed_forward|ffn|transformer_layer\.mlp)(\.|$)")),
)

_MLA_MODULES = re.compile(r"\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|q_a_layernorm|kv_a_layernorm|"
                          r"indexer)(\.|$)")
_LINEAR_ATTN = re.compile(r"\.(linear_attn|mixer)(\.|$)")


def split_role(pattern: str) -> tuple[str, str, str]:
    """Return (module pattern, parameter suffix, role) for a tensor-name pattern."""
    state = _BNB_STATE.search(pattern)
    if state:
        return pattern[: state.start()], pattern[state.start():], "other_companion"
    for suffix, role in _ROLE_SUFFIXES:
        if pattern.endswith(suffix):
            # gpt-oss: "experts.gate_up_proj_blocks" belongs to module "experts.gate_up_proj".
            return pattern[: -len(suffix)], suffix, role
    if _BARE_WEIGHT.search(pattern):
        # Fused 3-D experts are bare parameters: "mlp.experts.gate_up_proj" [E, 2I, H].
        return pattern, "", "weight"
    return pattern, "", "other"


def component_of(module: str) -> str:
    """The model component of a module pattern (one of records.COMPONENTS)."""
    text = module.lower() if module.isupper() else module
    for component, rule in _COMPONENT_RULES:
        if rule.search(text):
            return component
    return "other"


def attention_kind(module: str, config_kind: str, layer_type: str | None) -> str:
    """mla | linear | sliding | gqa | mha for an attention module."""
    if _MLA_MODULES.search(module):
        return "mla"
    if _LINEAR_ATTN.search(module) or layer_type == "linear_attention":
        return "linear"
    if layer_type == "sliding_attention":
        return "sliding"
    if config_kind in ("gqa", "mha", "mla"):
        return config_kind
    return "gqa" if config_kind in ("hybrid_linear", "sliding_hybrid") else "mha"


def expert_slot(pattern: str) -> int | None:
    """Which ``{}`` slot of the pattern holds the expert id (per-expert storage), if any."""
    position = pattern.find("experts.{}")
    if position < 0:
        return None
    return pattern.count("{}", 0, position)
