"""GGUF metadata -> ModelConfig and DeclaredQuant (what config.json gives a safetensors checkpoint).

Keys are llama.cpp's (gguf-py/gguf/constants.py ``Keys.General`` / ``Keys.LLM`` / ``Keys.Attention``;
src/llama-arch.cpp ``LLM_KV_NAMES``): ``{arch}.block_count`` counts every block *including* the NextN
(MTP) blocks, so the main decoder has ``block_count - {arch}.nextn_predict_layers`` layers (src/llama-
model.cpp loads ``n_layer_nextn`` and checks it is below ``n_layer_all``). Per-layer keys such as
``attention.head_count`` may be arrays; the report takes their maximum.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.errors import ConfigError
from ckptinspect.header.gguf import GgufArray, GgufHeader
from ckptinspect.records import DeclaredQuant, ModelConfig

# general.file_type -> llama.cpp ftype name (gguf-py constants.py ``class LlamaFileType``; the name
# llama-quantize prints and quant repos put in file names).
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}


def gguf_arch(header: GgufHeader, *, source: str) -> str:
    arch = header.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ConfigError("has no general.architecture string", path=source)
    return arch


def _int(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return None


def nextn_layers(header: GgufHeader, arch: str) -> int:
    return _int(header.metadata, f"{arch}.nextn_predict_layers") or 0


def gguf_model_config(header: GgufHeader, tensor_names: set[str], *, source: str) -> ModelConfig:
    """The first part's metadata as a ModelConfig (text keys only; vision lives in mmproj files)."""
    meta = header.metadata
    arch = gguf_arch(header, source=source)
    blocks = _int(meta, f"{arch}.block_count")
    if blocks is None or blocks < 0:
        raise ConfigError(f"has no {arch}.block_count", path=source)
    nextn = nextn_layers(header, arch)
    if nextn > blocks:
        raise ConfigError(f"{arch}.nextn_predict_layers ({nextn}) exceeds {arch}.block_count ({blocks})", path=source)
    layers = blocks - nextn
    if not nextn:  # NextN tensors without the key: their blocks are still not decoder layers
        nextn_bids = [int(n.split(".")[1]) for n in tensor_names if n.startswith("blk.") and ".nextn." in n
                      and n.split(".")[1].isdigit()]
        layers = min([layers, *nextn_bids])
    heads = _int(meta, f"{arch}.attention.head_count")
    kv_heads = _int(meta, f"{arch}.attention.head_count_kv")
    experts = _int(meta, f"{arch}.expert_count") or None
    kv_lora = _int(meta, f"{arch}.attention.kv_lora_rank")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = _int(meta, f"{arch}.vocab_size") or (tokens.count if isinstance(tokens, GgufArray)
                                                 else len(tokens) if isinstance(tokens, tuple) else None)
    # Hybrid models (qwen3next, qwen35*) mix Gated-DeltaNet blocks (ssm_* tensors, a fixed-size state)
    # with attention blocks: per layer from the tensors, since the layout keys differ per architecture.
    linear = {int(n.split(".")[1]) for n in tensor_names if n.startswith("blk.") and ".ssm_" in n
              and n.split(".")[1].isdigit()}
    layer_types = tuple("linear_attention" if b in linear else "full_attention" for b in range(layers))
    attention = "mla" if kv_lora else ("gqa" if heads and kv_heads and kv_heads < heads else "mha")
    if "linear_attention" in layer_types:
        attention = "hybrid_linear"
    plain = {k: v for k, v in meta.items() if not isinstance(v, (GgufArray, tuple))}
    return ModelConfig(
        architecture=arch, model_type=arch, text_model_type=None, text_config_path="",
        num_hidden_layers=layers, hidden_size=_int(meta, f"{arch}.embedding_length") or 0, vocab_size=vocab,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=_int(meta, f"{arch}.attention.key_length"),
        intermediate_size=_int(meta, f"{arch}.feed_forward_length"),
        moe_intermediate_size=_int(meta, f"{arch}.expert_feed_forward_length"),
        routed_experts=experts, experts_per_token=_int(meta, f"{arch}.expert_used_count") if experts else None,
        shared_experts=(_int(meta, f"{arch}.expert_shared_count") or 0) if experts else None,
        shared_expert_intermediate_size=_int(meta, f"{arch}.expert_shared_feed_forward_length"),
        first_dense_layers=_int(meta, f"{arch}.leading_dense_block_count") or 0,
        layer_types=layer_types, attention_kind=attention, kv_lora_rank=kv_lora,
        qk_rope_head_dim=_int(meta, f"{arch}.rope.dimension_count") if kv_lora else None,
        qk_nope_head_dim=None, v_head_dim=_int(meta, f"{arch}.attention.value_length"),
        max_position_embeddings=_int(meta, f"{arch}.context_length"), sliding_window=_int(meta, f"{arch}.attention.sliding_window"),
        tie_word_embeddings="output.weight" not in tensor_names, torch_dtype=None, has_remote_code=False,
        has_vision=False, raw={"gguf": plain}, text={"gguf": plain},
    )


def gguf_declared(header: GgufHeader) -> DeclaredQuant:
    """``general.file_type``: the quant mix llama-quantize was asked for (tensors may differ; the inventory says)."""
    ftype = header.get("general.file_type")
    name = FILE_TYPES.get(ftype) if isinstance(ftype, int) else None
    label = f"gguf:{name}" if name else None
    return DeclaredQuant(label=label, method="gguf" if name else None, algo=name, group_size=None, block_size=None,
                         scale_fmt=None, kv_cache=None, sources=("general.file_type",) if name else (), excludes=())
