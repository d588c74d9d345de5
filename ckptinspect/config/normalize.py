"""config.json -> ModelConfig.

Multimodal wrappers keep every language-model key under a nested config (Qwen3.5 and Kimi-K2.5 use
``text_config``); the top level keeps ``architectures`` and ``model_type``. Families name the same
fact differently (``n_routed_experts`` / ``num_experts`` / ``num_local_experts`` / ``moe_num_experts``),
so each fact is read from an ordered list of aliases.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.errors import ConfigError
from ckptinspect.records import ModelConfig

SOURCE = "config.json"
# `decoder`: encoder-decoder wrappers (Nemotron Parse's RadioMBartPrefixForCausalLM keeps its MBart decoder,
# d_model / decoder_layers, under `decoder`; VL:model_executor/models/nemotron_parse3_5.py reads config.decoder)
NESTED_TEXT_KEYS = ("text_config", "llm_config", "language_config", "decoder")

# fact -> aliases, first present wins (None values are skipped).
ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers"),
    "hidden_size": ("hidden_size", "d_model", "n_embd"),
    "vocab_size": ("vocab_size",),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size"),
    "moe_intermediate_size": ("moe_intermediate_size", "expert_intermediate_size"),
    "routed_experts": ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"),
    "experts_per_token": ("num_experts_per_tok", "moe_k", "moe_topk", "top_k", "num_experts_per_token"),
    "shared_experts": ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "first_dense_layers": ("first_k_dense_replace", "moe_layer_start_index", "first_k_dense"),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "max_position_embeddings": ("max_position_embeddings", "max_seq_len", "seq_length"),
    "sliding_window": ("sliding_window",),
}
REQUIRED = ("num_hidden_layers", "hidden_size")
# Upper bounds on the counts that later stages enumerate (one entry per layer, per expert id): a
# hostile 10**12 would otherwise hang the report. Real checkpoints have <= ~200 layers and <= 512
# routed experts per layer; the caps leave 50-100x headroom.
COUNT_CAPS = {"num_hidden_layers": 10_000, "routed_experts": 65_536}
# Keys read straight from the config by the planner (plan/kvcache.py, plan/fit.py) and readiness (the
# family rules' MTP depth and expert-count keys), outside ALIASES: checked here, once, so a list where an
# integer belongs (DSA `index_head_dim: [128]`) or an integer where a list belongs (DeepSeek-V4
# `compress_ratios: 4`) is one line naming config.json and the key, not a traceback in the plan.
# kind -> (upper bound, keys); None / absent is always allowed (the reader's default applies).
TYPED_KEYS: dict[str, tuple[int, tuple[str, ...]]] = {
    "layers": (COUNT_CAPS["num_hidden_layers"], (
        "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_mtp_layers", "num_mtp_modules")),
    "experts": (COUNT_CAPS["routed_experts"], (
        "mtp_num_experts", "dspark_n_routed_experts", "num_routed_experts")),
    "size": (1 << 20, (
        "index_head_dim", "index_topk", "index_n_heads", "window_size", "full_attention_interval",
        "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim",
        "linear_conv_kernel_dim")),
}
# kind -> (upper bound per item, keys) for lists of integers, at most one item per layer (+ MTP layers)
TYPED_LIST_KEYS: dict[str, tuple[int, tuple[str, ...]]] = {"size": (1 << 20, ("compress_ratios",))}
# Sub-objects whose keys the rules read by dotted path (``mtp_config.num_nextn_predict_layers``)
TYPED_SCOPES = ("text_config", "llm_config", "language_config", "mtp_config")
# Every integer fact must fit in a signed 64-bit integer, as in the engines' own config classes; a
# 400-digit value would otherwise overflow float arithmetic in the plan (OverflowError).
MAX_CONFIG_INT = 2 ** 63 - 1


def normalize_config(raw: Any, *, source: str = SOURCE) -> ModelConfig:
    """Build a ModelConfig from a parsed config.json.

    Raises:
        ConfigError: not an object, a required key missing, or a key of the wrong type.
    """
    if not isinstance(raw, dict):
        raise ConfigError("is not a JSON object", path=source)
    text_path, text = "", raw
    for key in NESTED_TEXT_KEYS:
        nested = raw.get(key)
        if key == "decoder" and any(k in raw for k in ALIASES["num_hidden_layers"]):
            break  # a top-level LM that merely has a `decoder` sub-dict keeps its own keys
        if isinstance(nested, dict) and any(k in nested for k in ALIASES["num_hidden_layers"]):
            text_path, text = key, nested
            break

    _check_typed_keys(raw, source)
    values: dict[str, int | None] = {}
    for fact, aliases in ALIASES.items():
        values[fact] = _int_alias(text, aliases, text_path, source)
    blocks = text.get("layers_block_type")
    if values["num_hidden_layers"] is None and isinstance(blocks, list) and blocks:
        # Nemotron-H configs that list their blocks carry no layer count (nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16):
        # the count is the list's length (transformers 5.19 models/nemotron_h/configuration_nemotron_h.py:240-245,
        # the num_hidden_layers property; vLLM and SGLang read the config through that class)
        values["num_hidden_layers"] = len(blocks)
    for fact, cap in COUNT_CAPS.items():
        if values[fact] is not None and values[fact] > cap:
            raise ConfigError(f"'{ALIASES[fact][0]}' (or an alias) is {values[fact]:,}, over the {cap:,} any real "
                              "model has", path=source)
    for fact in REQUIRED:
        if values[fact] is None:
            where = f"{text_path}." if text_path else ""
            raise ConfigError(f"missing '{where}{ALIASES[fact][0]}'", path=source)

    architectures = raw.get("architectures") or text.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ConfigError(f"'architectures' must be a list of strings, got {architectures!r}", path=source)
    model_type = raw.get("model_type", "")
    if not isinstance(model_type, str):
        raise ConfigError(f"'model_type' must be a string, got {model_type!r}", path=source)
    text_model_type = text.get("model_type") if text is not raw else None

    layers = values["num_hidden_layers"] or 0
    layer_types = _layer_types(text, layers, source)
    routed = values["routed_experts"]
    if routed is not None and routed <= 1:
        routed = None  # a single "expert" is a dense MLP
    shared = values["shared_experts"]
    if routed is not None and shared is None:
        sei = values["shared_expert_intermediate_size"]
        shared = 1 if sei else 0
    if routed is None:
        shared = None
    return ModelConfig(
        architecture=architectures[0] if architectures else (model_type or "unknown"),
        model_type=model_type,
        text_model_type=text_model_type if isinstance(text_model_type, str) else None,
        text_config_path=text_path,
        num_hidden_layers=layers,
        hidden_size=values["hidden_size"] or 0,
        vocab_size=values["vocab_size"],
        num_attention_heads=values["num_attention_heads"],
        num_key_value_heads=values["num_key_value_heads"] or values["num_attention_heads"],
        head_dim=values["head_dim"],
        intermediate_size=values["intermediate_size"],
        moe_intermediate_size=values["moe_intermediate_size"],
        routed_experts=routed,
        experts_per_token=values["experts_per_token"] if routed else None,
        shared_experts=shared,
        shared_expert_intermediate_size=values["shared_expert_intermediate_size"],
        first_dense_layers=values["first_dense_layers"] or 0,
        layer_types=layer_types,
        attention_kind=_attention_kind(values, layer_types),
        kv_lora_rank=values["kv_lora_rank"],
        qk_rope_head_dim=values["qk_rope_head_dim"],
        qk_nope_head_dim=values["qk_nope_head_dim"],
        v_head_dim=values["v_head_dim"],
        max_position_embeddings=values["max_position_embeddings"],
        sliding_window=values["sliding_window"],
        tie_word_embeddings=bool(text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))),
        torch_dtype=_dtype(raw, text),
        has_remote_code=isinstance(raw.get("auto_map"), dict),
        has_vision=any(k in raw for k in ("vision_config", "visual", "vision_tower")),
        raw=raw,
        text=text,
    )


def _int_alias(text: Mapping[str, Any], aliases: tuple[str, ...], text_path: str, source: str) -> int | None:
    for key in aliases:
        value = text.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            where = f"{text_path}.{key}" if text_path else key
            raise ConfigError(f"'{where}' must be an integer, got {value!r}", path=source)
        if value < 0:
            raise ConfigError(f"'{key}' must not be negative, got {value}", path=source)
        if value > MAX_CONFIG_INT:
            raise ConfigError(f"'{key}' is {len(str(value))} digits long, over the signed 64-bit range",
                              path=source)
        return value
    return None


def _check_typed_keys(raw: Mapping[str, Any], source: str) -> None:
    scopes = [("", raw)] + [(f"{name}.", raw[name]) for name in TYPED_SCOPES if isinstance(raw.get(name), dict)]
    for prefix, scope in scopes:
        for cap, keys in TYPED_KEYS.values():
            for key in keys:
                value = scope.get(key)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= cap:
                    raise ConfigError(f"{prefix}{key} must be a non-negative integer (at most {cap:,}), got "
                                      f"{_shown(value)}", path=source)
        for cap, keys in TYPED_LIST_KEYS.values():
            for key in keys:
                value = scope.get(key)
                if value is None:
                    continue
                limit = COUNT_CAPS["num_hidden_layers"] * 2
                if not isinstance(value, list) or len(value) > limit or any(
                        isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= cap for v in value):
                    raise ConfigError(f"{prefix}{key} must be a list of at most {limit:,} integers from 0 to "
                                      f"{cap:,}, got {_shown(value)}", path=source)


def _shown(value: Any) -> str:
    """A short, bounded rendering of a bad value (a 4,000-digit integer or a long list is not echoed)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 18:
        return f"an integer of {len(str(abs(value))):,} digits"
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} of {len(value):,} items" if len(value) > 8 else repr(value)[:120]
    return repr(value)[:120]


def _layer_types(text: Mapping[str, Any], layers: int, source: str) -> tuple[str, ...]:
    declared = text.get("layer_types")
    if declared is not None:
        if not isinstance(declared, list) or not all(isinstance(t, str) for t in declared):
            raise ConfigError("'layer_types' must be a list of strings", path=source)
        return tuple(declared)
    interval = text.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        # Qwen3-Next style hybrids: every interval-th layer is full attention, the rest linear.
        return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers))
    return ()


def _attention_kind(values: Mapping[str, int | None], layer_types: tuple[str, ...]) -> str:
    if values["kv_lora_rank"]:
        return "mla"
    if "linear_attention" in layer_types:
        return "hybrid_linear"
    if "sliding_attention" in layer_types:
        return "sliding_hybrid"
    heads, kv = values["num_attention_heads"], values["num_key_value_heads"]
    if heads and kv and kv < heads:
        return "gqa"
    return "mha"


def _dtype(raw: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    for node in (raw, text):
        for key in ("dtype", "torch_dtype"):
            value = node.get(key)
            if isinstance(value, str):
                return value
    return None
