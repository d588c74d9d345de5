"""params.json (Mistral's own checkpoint format) -> the config.json-shaped dict the report reads.

vLLM reads params.json instead of config.json when a checkpoint is in Mistral's format (header/index.py
``is_mistral_format``: the rule and its citations) and turns it into a Hugging Face config with its own adapter,
``adapt_config_dict`` (VL:transformers_utils/configs/mistral.py:14-102, vLLM 0.34.0). This module is that
mapping written as data: the key tables below, then the architecture branches in the adapter's order, so the
family rules match the architecture vLLM builds (MistralLarge4ForCausalLM for a params.json with a ``dsa``
block) and read the keys vLLM's model code reads (``mtp_config`` for the DSpark draft). Only what a report
reads is mapped; everything else in params.json passes through under its own name, as in the adapter.

Where vLLM 0.34.0 refuses a params.json (its asserts and ValueErrors), the report refuses it too: one
ConfigError naming params.json and the key, never a traceback.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

from ckptinspect.errors import ConfigError

SOURCE = "params.json"

# Mistral key -> Hugging Face key (VL:transformers_utils/configs/mistral.py:155-182 _remap_general_mistral_args)
RENAMES = {"dim": "hidden_size", "norm_eps": "rms_norm_eps", "n_kv_heads": "num_key_value_heads",
           "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size"}
# Mistral key -> (Hugging Face key, default when absent); model_type keeps its name (same lines)
RENAMES_WITH_DEFAULT = {"model_type": ("model_type", "transformer"), "activation": ("hidden_act", "silu"),
                        "tied_embeddings": ("tie_word_embeddings", False)}
# The adapter's default context when params.json has none and config.json gives none either
# (VL:transformers_utils/config.py:516-521 MistralConfigParser.parse, 1617-1634 _maybe_retrieve_max_pos_from_hf)
DEFAULT_MAX_POSITIONS = 128_000
# moe block key -> top-level Hugging Face key (mistral.py:304-326 _remap_moe_args), and what that remap sets
MOE_RENAMES = {"route_every_n": "moe_layer_freq", "first_k_dense_replace": "first_k_dense_replace",
               "num_experts_per_tok": "num_experts_per_tok", "num_experts": "n_routed_experts",
               "expert_hidden_dim": "moe_intermediate_size", "routed_scale": "routed_scaling_factor",
               "num_shared_experts": "n_shared_experts", "num_expert_groups": "n_group",
               "num_expert_groups_per_tok": "topk_group"}
MOE_FIXED = {"topk_method": None, "norm_topk_prob": True, "scoring_func": "softmax"}
# Integer keys of params.json the report counts with: checked here so a bad value is named as params.json spells it
INT_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "head_dim", "vocab_size", "kv_lora_rank",
            "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "max_position_embeddings")
MOE_INT_KEYS = ("num_experts", "num_experts_per_tok", "num_shared_experts", "expert_hidden_dim",
                "first_k_dense_replace", "route_every_n")
# Mistral Large 4's `dsa` block: unprefixed key -> the prefixed spelling (mistral.py:353-379), the keys the
# adapter requires (mistral.py:414-421: dsa.pop(key) raises without them) and the MTP (DSpark) block keys it
# requires to build the draft (mistral.py:477-513 get_mistral_large_4_dspark_config)
DSA_ALIASES = {"topk": "index_topk", "n_heads": "index_n_heads", "head_dim": "index_head_dim",
               "rope_head_dim": "index_rope_head_dim", "nope": "index_nope", "match_nope": "indexer_match_nope",
               "ssmax_scaling": "indexer_ssmax_scaling", "norm_eps": "indexer_norm_eps", "sharing": "index_sharing"}
DSA_REQUIRED = ("index_topk", "index_n_heads", "index_head_dim", "indexer_norm_eps", "indexer_ssmax_scaling")
DSPARK_HEADS = ("vanilla", "rnn")
DSPARK_INPUTS = ("shared_mask", "position_specific")


def adapt_params(params: Any, *, defaults: Mapping[str, Any] | None = None, source: str = SOURCE) -> dict[str, Any]:
    """The config dict vLLM 0.34.0 builds from ``params`` (a parsed params.json); ``defaults``: the checkpoint's
    config.json, if any, whose keys fill what params.json lacks (VL:transformers_utils/config.py:526-534, 556;
    mistral.py:95-96).

    Raises:
        ConfigError: naming ``source``: not an object, a key of the wrong type, or a block vLLM refuses.
    """
    if not isinstance(params, dict):
        raise ConfigError("is not a JSON object", path=source)
    cfg = copy.deepcopy(params)
    for key in INT_KEYS:
        _int(cfg, key, source)
    defaults = defaults if isinstance(defaults, dict) else {}
    if cfg.get("max_position_embeddings") is None:
        text = defaults.get("text_config") if isinstance(defaults.get("text_config"), dict) else defaults
        cfg["max_position_embeddings"] = text.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS
    for old, new in RENAMES.items():
        if old in cfg:
            cfg[new] = cfg.pop(old)
    for old, (new, default) in RENAMES_WITH_DEFAULT.items():
        cfg[new] = cfg.pop(old, default)
    cfg.setdefault("max_seq_len", cfg["max_position_embeddings"])
    _sliding_window(cfg, source)
    if cfg.get("quantization"):
        cfg["quantization_config"] = _quantization(cfg.pop("quantization"), source)
    moe = cfg.get("moe")
    if moe is not None and not isinstance(moe, dict):
        raise ConfigError(f"'moe' must be an object, got {moe!r}", path=source)
    for key in MOE_INT_KEYS:
        _int(moe or {}, key, source, where="moe.")
    is_mla = bool(cfg.get("qk_nope_head_dim"))
    if is_mla and not moe:
        # a dense MLA model: the adapter gives it a one-expert MoE that is dense in every layer (mistral.py:329-345)
        cfg["moe"] = moe = {"num_experts": 1, "first_k_dense_replace": cfg.get("num_hidden_layers"),
                            "route_every_n": 1, "num_shared_experts": 1,
                            "expert_hidden_dim": cfg.get("intermediate_size"), "num_experts_per_tok": 1,
                            "routed_scale": 1.0, "num_expert_groups": 1, "num_expert_groups_per_tok": 1}
    is_moe = bool(moe)
    shared_moe = is_moe and (moe.get("num_shared_experts") or 0) > 0  # vLLM's "is_mistral_large_3"
    # the architecture branches, in the adapter's order (mistral.py:33-62)
    if cfg.get("model_type") == "mamba":
        cfg["architectures"] = ["Mamba2ForCausalLM"]
    elif cfg.get("dsa"):
        if not (is_mla and shared_moe):
            raise ConfigError("has a 'dsa' block without MLA (qk_nope_head_dim) and an MoE with shared experts; "
                              "vLLM 0.34.0 refuses it ('Mistral DSA requires MLA + MoE')", path=source)
        _moe(cfg)
        _mistral_large_4(cfg, source)
        cfg["model_type"], cfg["architectures"] = "mistral_large_4", ["MistralLarge4ForCausalLM"]
    elif shared_moe:
        if "llama_4_scaling" not in cfg:
            raise ConfigError("is a Mistral Large 3 layout (an MoE with shared experts) without llama_4_scaling; "
                              "vLLM 0.34.0 refuses it", path=source)
        _moe(cfg)
        cfg["model_type"], cfg["architectures"] = "deepseek_v3", ["MistralLarge3ForCausalLM"]
    else:
        cfg["architectures"] = ["MixtralForCausalLM"] if is_moe else ["MistralForCausalLM"]
    scaling = cfg.get("llama_4_scaling")
    if scaling and (not isinstance(scaling, dict) or not {"original_max_position_embeddings", "beta"} <= set(scaling)):
        raise ConfigError("'llama_4_scaling' must define original_max_position_embeddings and beta", path=source)
    multimodal = cfg.get("multimodal") if isinstance(cfg.get("multimodal"), dict) else {}
    vision = multimodal.get("vision_encoder_args") or cfg.get("vision_encoder")
    audio = isinstance(multimodal.get("whisper_model_args"), dict) and multimodal["whisper_model_args"].get(
        "encoder_args")
    if vision and audio:
        raise ConfigError("has both a vision and an audio encoder; vLLM 0.34.0 refuses it", path=source)
    for key, value in defaults.items():
        cfg.setdefault(key, value)
    if vision or audio:
        # the multimodal wrappers keep the language model under text_config (mistral.py:105-120, 245-301)
        wrapper = {"model_type": "pixtral" if vision else "voxtral",
                   "architectures": ["PixtralForConditionalGeneration"] if vision else
                   ["VoxtralForConditionalGeneration"], "text_config": cfg}
        if cfg.get("quantization_config"):
            wrapper["quantization_config"] = cfg["quantization_config"]
        return wrapper
    return cfg


def _int(cfg: Mapping[str, Any], key: str, source: str, *, where: str = "") -> None:
    value = cfg.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"'{where}{key}' must be an integer, got {value!r}", path=source)


def _quantization(quant: Any, source: str) -> dict[str, Any]:
    """params.json's `quantization` block -> quantization_config (mistral.py:208-242)."""
    if not isinstance(quant, dict):
        raise ConfigError(f"'quantization' must be an object, got {quant!r}", path=source)
    if quant.get("qformat_weight") == "fp8_e4m3":
        act, weight = quant.get("qscheme_act"), quant.get("qscheme_weight")
        if act not in ("NO_SCALES", "TENSOR", "BLOCK", None) or (act == "BLOCK") != (weight == "BLOCK"):
            raise ConfigError(f"'quantization' has qscheme_act {act!r} / qscheme_weight {weight!r}; vLLM 0.34.0 "
                              "takes NO_SCALES, TENSOR or BLOCK, and BLOCK for both or neither", path=source)
        out: dict[str, Any] = {"quant_method": "fp8",
                               "activation_scheme": "dynamic" if act in ("NO_SCALES", "BLOCK") else "static"}
        if weight == "BLOCK":
            out["weight_block_size"] = [quant.get("block_size_out"), quant.get("block_size_in")]
        return out
    if str(quant.get("quant_method", "")).lower().replace("_", "-") == "compressed-tensors":
        return {**quant, "quant_method": "compressed-tensors"}
    raise ConfigError(f"'quantization' is neither fp8_e4m3 nor compressed-tensors ({quant!r}); vLLM 0.34.0 refuses "
                      "it", path=source)


def _sliding_window(cfg: dict[str, Any], source: str) -> None:
    """A per-layer sliding_window list -> layer_types + one window (mistral.py:185-205)."""
    window = cfg.get("sliding_window")
    if not window:
        return
    layers = cfg.get("num_hidden_layers")
    if isinstance(window, list):
        if not isinstance(layers, int) or len({w for w in window if w is not None}) > 1:
            raise ConfigError(f"'sliding_window' may list one window size (or null) per layer, got {window!r}",
                              path=source)
        cfg["layer_types"] = ["full_attention" if w is None else "sliding_attention"
                              for w in window * (layers // len(window))]
        cfg["sliding_window"] = next((w for w in window if w is not None), None)
    elif isinstance(window, int) and not isinstance(window, bool):
        if cfg.get("layer_types") is None and isinstance(layers, int):
            cfg["layer_types"] = ["sliding_attention"] * layers
    else:
        raise ConfigError(f"'sliding_window' must be an integer or a list, got {window!r}", path=source)


def _moe(cfg: dict[str, Any]) -> None:
    moe = cfg["moe"]
    for old, new in MOE_RENAMES.items():
        if old in moe:
            cfg[new] = moe[old]
    cfg.update(MOE_FIXED)


def _pattern(value: Any, layers: int, what: str, source: str) -> list[str]:
    """A comma-separated per-layer pattern repeated over the layers (mistral.py:348-350 _expand_layer_pattern)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"'{what}' must be a comma-separated string, got {value!r}", path=source)
    items = [v.strip() for v in value.split(",")]
    return (items * math.ceil(layers / len(items)))[:layers]


def _mistral_large_4(cfg: dict[str, Any], source: str) -> None:
    """Mistral Large 4's per-layer patterns, `dsa` keys and `mtp` block (mistral.py:382-447)."""
    layers = cfg.get("num_hidden_layers")
    if not isinstance(layers, int) or layers <= 0:
        raise ConfigError(f"'n_layers' must be a positive integer, got {layers!r}", path=source)
    nope = cfg.pop("nope", None)
    flags = [v == "nope" for v in _pattern(nope, layers, "nope", source)] if nope else [False] * layers
    cfg["nope_layer_flags"] = flags
    sharing = cfg.pop("kv_sharing", None) or {}
    if not isinstance(sharing, dict) or set(sharing) - {"source_layers_str"}:
        raise ConfigError(f"'kv_sharing' may hold source_layers_str only, got {sharing!r}", path=source)
    sources = list(range(layers))
    if sharing.get("source_layers_str"):
        try:
            sources = [int(v) for v in str(sharing["source_layers_str"]).split(",")]
        except ValueError:
            raise ConfigError("'kv_sharing.source_layers_str' must list layer numbers", path=source) from None
    if len(sources) != layers or any(not (0 <= s <= i) or sources[s] != s or flags[i] != flags[s]
                                     for i, s in enumerate(sources)):
        raise ConfigError("'kv_sharing.source_layers_str' must name, for each of the n_layers layers, itself or an "
                          "earlier non-sharing layer of the same rope/nope kind (vLLM 0.34.0 asserts this)",
                          path=source)
    cfg["kv_source_layers"] = sources
    dsa = cfg.pop("dsa")
    if not isinstance(dsa, dict):
        raise ConfigError(f"'dsa' must be an object, got {dsa!r}", path=source)
    dsa = dict(dsa)
    for short, long in DSA_ALIASES.items():
        if short in dsa:
            value = dsa.pop(short)
            if dsa.get(long, value) != value:
                raise ConfigError(f"'dsa' sets both {short} and {long}, to different values", path=source)
            dsa[long] = value
    missing = [k for k in DSA_REQUIRED if k not in dsa]
    if missing:
        raise ConfigError(f"'dsa' lacks {', '.join(missing)} (vLLM 0.34.0 requires them)", path=source)
    for key in DSA_REQUIRED:
        cfg[key] = dsa.pop(key)
    if dsa.pop("index_rope_head_dim", None) not in (None, -1, cfg.get("qk_rope_head_dim")):
        raise ConfigError("'dsa.rope_head_dim' must be the model's qk_rope_head_dim (vLLM 0.34.0 asserts it)",
                          path=source)
    if dsa.pop("index_nope", False) or not dsa.pop("fp8_indexer", True):
        raise ConfigError("'dsa' asks for a NoPE indexer or a non-FP8 indexer cache, which vLLM 0.34.0 refuses",
                          path=source)
    cfg["indexer_nope_layer_flags"] = list(flags) if dsa.pop("indexer_match_nope", False) else [False] * layers
    cfg["fp8_kv_cache"] = dsa.pop("fp8_kv_cache", False)
    sharing_pattern = dsa.pop("index_sharing", None)
    cfg["index_sharing"] = _pattern(sharing_pattern, layers, "dsa.index_sharing", source) if sharing_pattern \
        else ["full"] * layers
    if set(cfg["index_sharing"]) - {"full", "shared"} or cfg["index_sharing"][0] != "full":
        raise ConfigError("'dsa.index_sharing' must be full / shared per layer, starting with full", path=source)
    if dsa:
        raise ConfigError(f"'dsa' has keys vLLM 0.34.0 does not parse ({', '.join(sorted(dsa))}) and refuses",
                          path=source)
    mtp = cfg.pop("mtp", None)
    if mtp is not None:
        cfg["mtp_config"] = _dspark(mtp, source)


def _dspark(mtp: Any, source: str) -> dict[str, Any]:
    """The `mtp` block, checked as vLLM 0.34.0 checks it when it builds the DSpark draft (mistral.py:450-513).

    vLLM raises there only when speculative decoding is asked for (the target alone still loads); the report
    refuses such a block at once, saying so, rather than judge a draft vLLM would not build."""
    if not isinstance(mtp, dict):
        raise ConfigError(f"'mtp' must be an object, got {mtp!r}", path=source)
    for key in ("n_layers", "depth"):
        value = mtp.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"'mtp.{key}' must be a non-negative integer, got {value!r}", path=source)
    dspark = mtp.get("dspark")
    if dspark is not None:
        if not isinstance(dspark, dict):
            raise ConfigError(f"'mtp.dspark' must be an object, got {dspark!r}", path=source)
        if dspark.get("head_type", "vanilla") not in DSPARK_HEADS:
            raise ConfigError(f"'mtp.dspark.head_type' must be one of {', '.join(DSPARK_HEADS)} (vLLM 0.34.0 "
                              "refuses the DSpark draft otherwise)", path=source)
        if dspark.get("draft_input", "shared_mask") not in DSPARK_INPUTS:
            raise ConfigError(f"'mtp.dspark.draft_input' must be one of {', '.join(DSPARK_INPUTS)} (vLLM 0.34.0 "
                              "refuses the DSpark draft otherwise)", path=source)
        taps = str(mtp.get("target_activation_layers") or "")
        try:
            layers = [int(v) for v in taps.split(",") if v.strip()]
        except ValueError:
            layers = []
        if not layers or any(v < 0 for v in layers) or layers != sorted(set(layers)):
            raise ConfigError("'mtp.target_activation_layers' must list unique, ascending, non-negative layer "
                              f"numbers for DSpark, got {mtp.get('target_activation_layers')!r} (vLLM 0.34.0 refuses "
                              "the DSpark draft otherwise; the target alone would load)", path=source)
    return dict(mtp)
