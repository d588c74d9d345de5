"""The one KV-cache model of every plan (SGLang, vLLM and llama.cpp), and SGLang's static-memory fraction.

- mem_fraction_static follows `_handle_gpu_memory_settings` (SG:arg_groups/memory_hook.py) with the
  constants copied into rules/engines/sglang.yaml `memory`, then the field caps listed there.
- KV per request (KvCost, constants and sources in rules/engines/common.yaml `kv_models`):
  MLA caches one latent (kv_lora_rank + qk_rope_head_dim) per layer on every rank; DSA models
  (DeepSeek-V3.2, GLM-5: `index_topk` in config) add the indexer's FP8 key + scale per layer;
  DeepSeek-V4 (`compress_ratios`) caches each layer compressed 1/ratio plus a sliding window;
  GQA / MHA cache K and V for the KV heads a rank owns (at least one: replicated when kv < tp);
  sliding-window layers (gpt-oss, Gemma-style `layer_types`) hold at most `sliding_window` tokens;
  hybrid linear attention caches only its full-attention layers and adds a fixed per-request
  conv + SSM state for every linear layer.
- The same rules per layer (``layer_kv_bytes``): what one layer holds for one request, for a plan that
  places layers one by one (llama.cpp offloads whole blocks, plan/llamacpp.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptinspect.plan.gpus import GpuSpec
from ckptinspect.plan.rules import PlanFacts, engine_rule_file, engine_rules, first_match
from ckptinspect.records import Checkpoint


@dataclass(frozen=True)
class MemFraction:
    value: float  # what the plan passes as --mem-fraction-static
    formula: float  # SGLang's own auto value for this GPU / TP
    reserved_mib: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    cap_reason: str | None
    source: str


def _prefill_graph_sizes(limit: int, ranges: list[list[int]]) -> int:
    return sum(1 for start, stop, step in ranges for s in range(start, stop + 1, step) if s <= limit)


def sglang_mem_fraction(gpu: GpuSpec, tp: int, facts: PlanFacts, *, chunked_prefill: int | None = None,
                        capped: bool = True) -> MemFraction:
    """SGLang's auto --mem-fraction-static for this GPU / TP (at ``chunked_prefill`` when given), then the caps."""
    rules = engine_rules("sglang")["memory"]
    mem_mib = gpu.memory_gib * 1024
    tier = next(t for t in rules["tiers"] if gpu.memory_gib < t["below_gib"])
    chunked = chunked_prefill or tier["chunked_prefill"]
    max_bs = tier["max_bs_large_tp"] if tp >= rules["large_tp_from"] else tier["max_bs_small_tp"]
    reserved = rules["base_mib"]
    reserved += max(chunked, rules["activation_min_tokens"]) * rules["activation_mib_per_token"]
    reserved += tp / 8 * rules["per_8_ranks_mib"]
    reserved += max_bs * rules["decode_graph_mib_per_bs"]
    if facts.attention == "mla":
        reserved += rules["prefill_graph_mla_mib"]
    else:
        reserved += _prefill_graph_sizes(chunked, rules["prefill_graph_sizes"]) * rules["prefill_graph_mib_per_size"]
    if gpu.memory_gib > rules["floor_above_gib"]:
        reserved = max(reserved, rules["floor_mib"])
    formula = round((mem_mib - reserved) / mem_mib, rules["round_digits"])
    cap = first_match(rules["caps"], facts, source=engine_rule_file("sglang")) if capped else None
    value, reason = formula, None
    if cap is not None and cap["max_fraction"] < formula:
        value, reason = cap["max_fraction"], f"{cap['reason']} ({cap['source']})"
    return MemFraction(value, formula, reserved, chunked, max_bs, reason, rules["source"])


def full_attention_layers(ck: Checkpoint) -> int:
    types = ck.config.layer_types
    if not types:
        return ck.config.num_hidden_layers
    return sum(1 for t in types if t not in ("linear_attention", "sliding_attention"))


def linear_attention_layers(ck: Checkpoint) -> int:
    return sum(1 for t in ck.config.layer_types if t == "linear_attention")


def sliding_attention_layers(ck: Checkpoint) -> int:
    return sum(1 for t in ck.config.layer_types if t == "sliding_attention")


@dataclass(frozen=True)
class KvCost:
    """What one request costs in the KV pool of one rank, as a function of its context length L:
    ``L * per_token + max(min(L, window), swa_ratio * L) * window_bytes_per_token + state``.

    Window layers need min(L, window) tokens; SGLang's hybrid SWA pool is sized at swa_ratio x the
    full-attention tokens, so beyond window / swa_ratio that pool, not the window, is what grows.
    """

    model: str  # mla | dsa | dsv4_compressed | gqa | sliding_window | hybrid_linear
    per_token: float
    window: int  # tokens a bounded (sliding / SWA) layer keeps; 0 when none
    window_bytes_per_token: float
    state: int  # fixed per-request bytes (GDN conv + SSM state)
    source: str
    swa_ratio: float = 0.0  # SWA pool tokens per full-attention token (SGLang --swa-full-tokens-ratio)

    def window_tokens(self, context: int) -> float:
        return max(min(context, self.window), self.swa_ratio * context)

    def request_bytes(self, context: int) -> float:
        return context * self.per_token + self.window_tokens(context) * self.window_bytes_per_token + self.state

    def fixed_bytes(self, context: int) -> float:
        """The part of request_bytes outside the full-attention token pool."""
        return self.window_tokens(context) * self.window_bytes_per_token + self.state


def _elem(kv_dtype: str) -> float:
    return engine_rules("common")["planning"]["kv_dtype_bytes"][kv_dtype]


def _kv_models() -> dict[str, Any]:
    return engine_rules("common")["kv_models"]


def _mla_cost(ck: Checkpoint, kv_dtype: str, extra_layers: int) -> KvCost:
    if ck.config.text.get("compress_ratios"):
        return _dsv4_cost(ck, extra_layers)
    layers = full_attention_layers(ck) + extra_layers
    model, row, source = _mla_row(ck, kv_dtype)
    return KvCost(model, row * layers, 0, 0.0, 0, source)


def _mla_row(ck: Checkpoint, kv_dtype: str) -> tuple[str, float, str]:
    """(mla | dsa, bytes one token costs in one MLA layer, source): the latent, plus the DSA indexer's key."""
    cfg, t, models = ck.config, ck.config.text, _kv_models()
    rank, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    if not t.get("index_topk"):
        return "mla", (rank + rope) * _elem(kv_dtype), models["mla"]["source"]
    dsa = models["dsa"]
    head = int(t.get("index_head_dim") or dsa["default_index_head_dim"])
    indexer = head + head // dsa["quant_block"] * dsa["scale_bytes"]
    if _elem(kv_dtype) == 1:
        # FP8 DSA rows: FP8 latent + one FP32 scale per 128 values + the rope part kept in BF16.
        row = rank + rank // dsa["quant_block"] * dsa["scale_bytes"] + rope * 2
    else:
        row = (rank + rope) * _elem(kv_dtype)
    return "dsa", row + indexer, dsa["source"]


@dataclass(frozen=True)
class _Dsv4Layers:
    """DeepSeek-V4's compressed layers: per layer 1/ratio of a latent slot per token, plus a window of slots."""

    ratios: list[int]  # per main layer; draft (MTP) layers have ratio 0 (window only, like pure-SWA layers)
    slot: int  # bytes of one FlashMLA-layout latent slot
    indexer: int  # FP8 index key + scale (ratio 4 layers)
    low_indexer: int  # FP4 index key + scales (ratio 1 / 2 layers)
    window: int
    source: str

    def per_full_token(self, ratio: int) -> float:
        if ratio in (1, 2):
            return (self.slot + self.low_indexer) / ratio
        if ratio == 4:
            return self.slot / 4 + self.indexer / 4
        return self.slot / ratio if ratio > 2 else 0.0


def _dsv4_layers(ck: Checkpoint) -> _Dsv4Layers:
    t, m = ck.config.text, _kv_models()["dsv4_compressed"]
    nope = int(t.get("qk_nope_head_dim") or m["default_nope"])
    rope = int(t.get("qk_rope_head_dim") or 64)
    head = int(t.get("index_head_dim") or 128)
    window = int(t.get("window_size") or t.get("sliding_window") or m["default_window"])
    return _Dsv4Layers([int(r) for r in t["compress_ratios"]], nope + 2 * rope + m["slot_scale_bytes"],
                       head + head // 128 * 4, head // 2 + head // 32, window, m["source"])


def _dsv4_cost(ck: Checkpoint, extra_layers: int) -> KvCost:
    v4 = _dsv4_layers(ck)
    ratios = v4.ratios + [0] * extra_layers
    per_token = sum(v4.per_full_token(r) for r in ratios)
    return KvCost("dsv4_compressed", per_token, v4.window, v4.slot * len(ratios), 0, v4.source)


def _gqa_layer(ck: Checkpoint, tp: int, kv_dtype: str) -> float:
    """Bytes one token costs in one GQA / MHA layer on one rank: K and V of the KV heads the rank owns (at
    least one: replicated when kv < tp)."""
    cfg = ck.config
    kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads or 1
    head_dim = cfg.head_dim or cfg.hidden_size // (cfg.num_attention_heads or 1)
    heads_per_rank = max(-(-kv_heads // tp), 1)
    return 2 * heads_per_rank * head_dim * _elem(kv_dtype)


def kv_cost(ck: Checkpoint, tp: int, kv_dtype: str, extra_layers: int = 0) -> KvCost:
    """Per-request KV cost on one rank (extra_layers: draft MTP layers with their own full KV)."""
    cfg, models = ck.config, _kv_models()
    if cfg.attention_kind == "mla":
        return _mla_cost(ck, kv_dtype, extra_layers)
    per_layer = _gqa_layer(ck, tp, kv_dtype)
    full = (full_attention_layers(ck) + extra_layers) * per_layer
    sliding = sliding_attention_layers(ck)
    if sliding and cfg.sliding_window:
        swa = models["sliding_window"]
        return KvCost("sliding_window", full, int(cfg.sliding_window), sliding * per_layer, 0, swa["source"],
                      swa_ratio=swa["swa_full_tokens_ratio"])
    state = state_bytes_per_request(ck, tp)
    if state:
        return KvCost("hybrid_linear", full, 0, 0.0, state, models["hybrid_linear"]["source"])
    return KvCost("gqa", full, 0, 0.0, 0, models["gqa"]["source"])


def layer_kv_bytes(ck: Checkpoint, layer: int, context: int, kv_dtype: str, tp: int = 1) -> float:
    """What layer ``layer`` caches for one request of ``context`` tokens on one rank, by kv_cost's rules
    taken per layer: a linear-attention layer its share of the fixed conv + SSM state, a sliding-window
    layer at most ``sliding_window`` tokens, an MLA / DSA layer its latent (+ indexer) row per token, a
    DeepSeek-V4 layer its compressed share plus its window, any other its K and V. ``layer`` at or past
    the main layers' count is a draft (MTP / NextN) layer: full attention (DeepSeek-V4: window only)."""
    cfg = ck.config
    types = cfg.layer_types
    kind = types[layer] if layer < len(types) else None
    if kind == "linear_attention":
        return state_bytes_per_request(ck, tp) / linear_attention_layers(ck)
    if cfg.attention_kind == "mla":
        if cfg.text.get("compress_ratios"):
            v4 = _dsv4_layers(ck)
            ratio = v4.ratios[layer] if layer < len(v4.ratios) else 0
            return v4.per_full_token(ratio) * context + min(context, v4.window) * v4.slot
        return _mla_row(ck, kv_dtype)[1] * context
    per_token = _gqa_layer(ck, tp, kv_dtype)
    if kind == "sliding_attention":  # as kv_cost: without a sliding_window in the config it counts none
        return per_token * min(context, int(cfg.sliding_window)) if cfg.sliding_window else 0.0
    return per_token * context


def kv_bytes_per_token(ck: Checkpoint, tp: int, kv_dtype: str, extra_layers: int = 0) -> float:
    """Bytes one cached token costs on one rank in the layers whose cache grows with the context."""
    return kv_cost(ck, tp, kv_dtype, extra_layers).per_token


def _count(ck: Checkpoint, key: str, default: int) -> int:
    """A config size the state model multiplies: a non-negative integer, else one ConfigError line
    (a string there crashed the plan with a TypeError; found by benchmarks/fuzz.py, seed 2)."""
    from ckptinspect.errors import ConfigError

    value = ck.config.text.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 1 << 20:
        raise ConfigError(f"{key} must be a non-negative integer, got {value!r}", path=f"{ck.location}/config.json")
    return value


def state_bytes_per_request(ck: Checkpoint, tp: int) -> int:
    """GDN conv + SSM state one request holds on one rank (0 without linear-attention layers)."""
    layers = linear_attention_layers(ck)
    if not layers:
        return 0
    planning = engine_rules("common")["planning"]
    k_heads, k_dim = _count(ck, "linear_num_key_heads", 0), _count(ck, "linear_key_head_dim", 0)
    v_heads, v_dim = _count(ck, "linear_num_value_heads", 0), _count(ck, "linear_value_head_dim", 0)
    kernel = _count(ck, "linear_conv_kernel_dim", 1)
    conv_dim = (2 * k_heads * k_dim + v_heads * v_dim) / tp
    conv = conv_dim * (kernel - 1) * planning["conv_state_bytes"]
    ssm = (v_heads / tp) * k_dim * v_dim * planning["ssm_state_bytes"]
    return int(layers * (conv + ssm))


@dataclass(frozen=True)
class KvCapacity:
    kv_dtype: str
    budget_bytes: int  # static pool minus weights, per rank
    bytes_per_token: float
    state_bytes_per_request: int  # fixed per-request bytes (state + bounded window) at this context
    context: int
    max_running_requests: int  # full-context requests that fit (capped by the goal target)
    tokens: int  # total KV tokens after reserving per-request fixed bytes
    fits_one_request: bool
    miss_bytes: int  # > 0: bytes short of one full-context request
    model: str = "gqa"


def kv_capacity(budget_bytes: int, cost: KvCost, context: int, target_requests: int, kv_dtype: str) -> KvCapacity:
    """Pool tokens after reserving per-request fixed bytes for the running requests.

    The goal's request target is kept unless the fixed bytes it reserves would leave the token pool
    smaller than one full-context request; then it drops to what still leaves that much.
    """
    per_token, fixed = cost.per_token, int(cost.fixed_bytes(context))
    one = cost.request_bytes(context)
    if budget_bytes < one:
        return KvCapacity(kv_dtype, budget_bytes, per_token, fixed, context, 0, 0, False, int(one - budget_bytes),
                          cost.model)
    running = target_requests
    if fixed:
        running = max(min(target_requests, int((budget_bytes - context * per_token) // fixed)), 1)
    tokens = int((budget_bytes - running * fixed) // per_token) if per_token else context * running
    return KvCapacity(kv_dtype, budget_bytes, per_token, fixed, context, running, tokens, True, 0, cost.model)
