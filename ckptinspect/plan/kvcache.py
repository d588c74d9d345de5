"""SGLang's static-memory fraction and the KV-cache capacity it leaves, per attention kind.

- mem_fraction_static follows `_handle_gpu_memory_settings` (SG:arg_groups/memory_hook.py) with the
  constants copied into rules/engines/sglang.yaml `memory`, then the field caps listed there.
- KV per token: MLA caches one latent (kv_lora_rank + qk_rope_head_dim) per layer on every rank;
  GQA / MHA cache K and V for the KV heads a rank owns (at least one: replicated when kv < tp);
  hybrid linear attention caches only its full-attention layers and adds a fixed per-request
  conv + SSM state for every linear layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptinspect.plan.gpus import GpuSpec
from ckptinspect.plan.rules import Facts, engine_rules, first_match
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


def sglang_mem_fraction(gpu: GpuSpec, tp: int, facts: Facts) -> MemFraction:
    rules = engine_rules("sglang")["memory"]
    mem_mib = gpu.memory_gib * 1024
    tier = next(t for t in rules["tiers"] if gpu.memory_gib < t["below_gib"])
    chunked = tier["chunked_prefill"]
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
    cap = first_match(rules["caps"], facts)
    value, reason = formula, None
    if cap is not None and cap["max_fraction"] < formula:
        value, reason = cap["max_fraction"], f"{cap['reason']} ({cap['source']})"
    return MemFraction(value, formula, reserved, chunked, max_bs, reason, rules["source"])


def full_attention_layers(ck: Checkpoint) -> int:
    types = ck.config.layer_types
    if not types:
        return ck.config.num_hidden_layers
    return sum(1 for t in types if t != "linear_attention")


def linear_attention_layers(ck: Checkpoint) -> int:
    return sum(1 for t in ck.config.layer_types if t == "linear_attention")


def kv_bytes_per_token(ck: Checkpoint, tp: int, kv_dtype: str, extra_layers: int = 0) -> float:
    """Bytes one cached token costs on one rank (extra_layers: draft MTP layers with their own KV)."""
    cfg = ck.config
    elem = engine_rules("common")["planning"]["kv_dtype_bytes"][kv_dtype]
    layers = full_attention_layers(ck) + extra_layers
    if cfg.attention_kind == "mla":
        return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * layers * elem
    kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads or 1
    head_dim = cfg.head_dim or cfg.hidden_size // (cfg.num_attention_heads or 1)
    heads_per_rank = max(-(-kv_heads // tp), 1)
    return 2 * heads_per_rank * head_dim * layers * elem


def state_bytes_per_request(ck: Checkpoint, tp: int) -> int:
    """GDN conv + SSM state one request holds on one rank (0 without linear-attention layers)."""
    layers = linear_attention_layers(ck)
    if not layers:
        return 0
    planning = engine_rules("common")["planning"]
    t = ck.config.text
    k_heads, k_dim = t.get("linear_num_key_heads", 0), t.get("linear_key_head_dim", 0)
    v_heads, v_dim = t.get("linear_num_value_heads", 0), t.get("linear_value_head_dim", 0)
    kernel = t.get("linear_conv_kernel_dim", 1)
    conv_dim = (2 * k_heads * k_dim + v_heads * v_dim) / tp
    conv = conv_dim * (kernel - 1) * planning["conv_state_bytes"]
    ssm = (v_heads / tp) * k_dim * v_dim * planning["ssm_state_bytes"]
    return int(layers * (conv + ssm))


@dataclass(frozen=True)
class KvCapacity:
    kv_dtype: str
    budget_bytes: int  # static pool minus weights, per rank
    bytes_per_token: float
    state_bytes_per_request: int
    context: int
    max_running_requests: int  # full-context requests that fit (capped by the goal target)
    tokens: int  # total KV tokens after reserving per-request state
    fits_one_request: bool
    miss_bytes: int  # > 0: bytes short of one full-context request

    def to_json(self, gib: int) -> dict[str, Any]:
        return {
            "kv_cache_dtype": self.kv_dtype, "budget_gib_per_gpu": round(self.budget_bytes / gib, 2),
            "bytes_per_token_per_gpu": round(self.bytes_per_token, 1),
            "state_mib_per_request": round(self.state_bytes_per_request / 2**20, 2),
            "context": self.context, "tokens": self.tokens,
            "full_context_requests": self.tokens // self.context if self.context else 0,
            "max_running_requests": self.max_running_requests,
        }


def kv_capacity(budget_bytes: int, per_token: float, state: int, context: int, target_requests: int,
                kv_dtype: str) -> KvCapacity:
    """Pool tokens after reserving per-request state for the running requests.

    The goal's request target is kept unless the state it reserves would leave the token pool
    smaller than one full-context request; then it drops to what still leaves that much.
    """
    one = context * per_token + state
    if budget_bytes < one:
        return KvCapacity(kv_dtype, budget_bytes, per_token, state, context, 0, 0, False, int(one - budget_bytes))
    running = target_requests
    if state:
        running = max(min(target_requests, int((budget_bytes - context * per_token) // state)), 1)
    tokens = int((budget_bytes - running * state) // per_token)
    return KvCapacity(kv_dtype, budget_bytes, per_token, state, context, running, tokens, True, 0)
