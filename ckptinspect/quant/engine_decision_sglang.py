"""SGLang-only per-module procedures (rules/quant/sglang.yaml names them; engine_decision.py dispatches).

Each restates one SGLang 0.5.23 function for one module as SGLang asks it (a fused ``qkv_proj`` /
``gate_up_proj`` Linear, a whole ``...mlp.experts`` fused MoE); tests/test_draft_quant_sglang.py checks
them against SGLang's own classes. SG: = sgl-project/sglang:python/sglang/srt/ at tag v0.5.23.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.quant.built_as import ERROR, QUANTIZED, UNKNOWN, UNQUANTIZED
from ckptinspect.safe_regex import UnsupportedPattern, compile_re2, python_accepts, translate

# --- SG:layers/quantization/auto_round.py AutoRoundConfig.get_layer_config ---------------------------

# get_config tries an extra_config key as a regex only when it holds one of these characters.
_REGEX_CHARS = frozenset(r"*+?^$()[]{}|\\")


def _auto_round_config(extra: Mapping[str, Any], name: str, quantized: bool, base: tuple) -> tuple[tuple, str]:
    """get_config: (bits, group_size, sym) of ``name`` and the entry that gave it: the exact key, then
    the first regex key that re.fullmatches, else the defaults (16 bits when not ``quantized``)."""
    default = base if quantized else (16, -1, True)

    def values(cfg: Any) -> tuple:
        if not isinstance(cfg, Mapping):
            raise UnsupportedPattern(f"extra_config entry for {name!r} is not an object")
        return tuple(cfg.get(k, d) for k, d in zip(("bits", "group_size", "sym"), default))

    if name in extra:
        return values(extra[name]), f"extra_config[{name!r}]"
    for pattern, cfg in extra.items():
        if not isinstance(pattern, str) or not _REGEX_CHARS.intersection(pattern) or not python_accepts(pattern):
            continue
        if compile_re2(translate(pattern)).fullmatch(name):
            return values(cfg), f"extra_config regex {pattern!r}"
    return default, ""


def _auto_round_blocks(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202 - procedure signature
    """AutoRound / INC: ``extra_config`` names a module exactly, then ``block_name_to_quantize`` (or
    ``to_quant_block_names``; every block when neither is set) decides by name prefix; with an
    ``extra_config`` a fused MoE takes the one config of its listed experts, a fused Linear the one
    config of its shards (different ones raise), other modules an exact or regex key. Built quantized
    when the resulting bits are under 16 (get_layer_config, check_quantized)."""
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    extra = raw.get("extra_config") if isinstance(raw.get("extra_config"), Mapping) else {}
    base = (raw.get("bits"), raw.get("group_size"), raw.get("sym"))
    blocks = raw.get("block_name_to_quantize") or raw.get("to_quant_block_names")
    names = (blocks.split(",") if isinstance(blocks, str) else [str(b) for b in blocks]) if blocks else []
    hit = next((b for b in names if prefix.startswith(b)), None)
    quantized = hit is not None or not names
    block_why = (f"block_name_to_quantize entry {hit!r}" if hit is not None else
                 f"under no block_name_to_quantize entry ({', '.join(names)[:120]})" if names else
                 "no block_name_to_quantize: every block")
    if not extra:
        return (QUANTIZED if quantized else UNQUANTIZED), block_why
    if prefix in extra:
        config, why = _auto_round_config(extra, prefix, True, base)
    else:
        config, why = _auto_round_config(extra, prefix, quantized, base)
        subs = [n for n in extra if kind == "moe" and n.startswith(prefix)]
        if not subs:
            fusion = next(((k, v) for k, v in packed.items() if k in prefix and prefix.count(k) == 1), None)
            subs = [prefix.replace(fusion[0], s) for s in fusion[1]] if fusion else []
        if subs:
            configs = {n: _auto_round_config(extra, n, quantized, base) for n in subs}
            if len({repr(c) for c, _ in configs.values()}) > 1:
                return ERROR, (f"extra_config gives the parts of {prefix} different configs; SGLang raises "
                               f"'... requires consistent quant config'")
            config, why = next(iter(configs.values()))
            why = why or f"the parts of {prefix} ({', '.join(subs[:3])})"
    bits = config[0]
    if not isinstance(bits, int) or isinstance(bits, bool):
        return UNKNOWN, f"{why or block_why}: bits {bits!r} is not a number"
    return (QUANTIZED if bits < 16 else UNQUANTIZED), f"{why or block_why} ({bits} bits)"


# --- SG:layers/quantization/modelslim/modelslim.py ModelSlimConfig -----------------------------------

_LINEAR_SCHEMES = frozenset({"W4A4_DYNAMIC", "W8A8", "W8A8_DYNAMIC", "W8A8_MXFP8", "W4A8_MXFP", "W4A4_MXFP4"})
_MOE_SCHEMES = frozenset({"W4A4_MXFP4", "W4A8_MXFP", "W4A4_DYNAMIC", "W4A8_DYNAMIC", "W8A8_DYNAMIC", "W8A8_MXFP8"})
_DSPARK_PARTS = (("attn.", "self_attn."), ("ffn.", "mlp."), ("attn_norm.", "input_layernorm."),
                 ("ffn_norm.", "post_attention_layernorm."))
_last_map: list[Any] = [None, None]  # (the declared description, its map as ModelSlimConfig holds it)


def _modelslim_map(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The type map as ModelSlimConfig.__init__ leaves it: every ``block_sparse_moe`` key also under
    ``mlp``, and DSpark's ``mtp.<stage>.*`` keys also under the draft's runtime ``stages.<stage>.*`` names
    (the file's own keys win). Built once per description (they run to 100,000 keys)."""
    if _last_map[0] is raw:
        return _last_map[1]
    out = dict(raw)
    for k in list(out):
        if isinstance(k, str) and "block_sparse_moe" in k:
            out[k.replace("block_sparse_moe.experts", "mlp.experts")
                 .replace("block_sparse_moe.shared_experts", "mlp.shared_experts")] = out[k]
    aliases = {}
    for name, scheme in out.items():
        parts = name.split(".", 2) if isinstance(name, str) and name.startswith("mtp.") else []
        if len(parts) != 3 or not parts[1].isdigit() or parts[2].startswith(("embed.", "embed_tokens.", "head.",
                                                                               "lm_head.")):
            continue
        rest = parts[2]
        if rest.startswith(("markov_head.", "confidence_head.")):
            aliases[rest] = scheme
            continue
        for old, new in _DSPARK_PARTS:
            if rest.startswith(old):
                rest = new + rest.removeprefix(old)
                break
        for old, new in ((".w1.", ".gate_proj."), (".w2.", ".down_proj."), (".w3.", ".up_proj."),
                         (".gate.tid2eid", ".topk.tid2eid"), (".gate.bias", ".gate.e_score_correction_bias")):
            rest = rest.replace(old, new)
        aliases[f"stages.{parts[1]}.{rest}"] = scheme
    out = {**aliases, **out}
    _last_map[:] = [raw, out]
    return out


def _modelslim_candidates(prefix: str) -> list[str]:
    """_quant_prefix_candidates: the name, its ``block_sparse_moe`` spelling, each with and without an
    outer ``language_model.``."""
    candidates = [prefix] + ([prefix.replace(".mlp.", ".block_sparse_moe.")] if ".mlp." in prefix else [])
    for c in list(candidates):
        candidates.append(c.removeprefix("language_model.") if c.startswith("language_model.") else f"language_model.{c}")
    return list(dict.fromkeys(candidates))


def _modelslim_resolve(desc: Mapping[str, Any], prefix: str) -> str:
    return next((c for c in _modelslim_candidates(prefix) if c + ".weight" in desc), prefix)


def _modelslim(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """ModelSlim (Ascend): the per-tensor type map decides. A Linear whose weight (each shard of a fused
    one, which must agree) is ``FLOAT`` is unquantized, one with a known linear scheme quantized, any
    other type unquantized (SGLang logs 'Unsupported Linear modelslim scheme'). A fused MoE takes expert
    0's gate / up (which must agree) and down types; a missing or unknown type fails the load
    (ModelSlimConfig.get_quant_method, is_layer_skipped, get_linear_scheme, get_moe_scheme). The map is
    read as SGLang 0.5.23 reads the packed mapping on an NPU (SG:model_loader/loader.py
    _get_quantization_config: the model's fused names under "model")."""
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    if any(isinstance(k, str) and k.startswith("hc_head_") for k in raw):
        raise UnsupportedPattern("DeepSeek-V4 ModelSlim names are remapped by the model class first")
    desc = _modelslim_map(raw)
    where = "quant_model_description.json"
    if kind == "moe":
        for cand in _modelslim_candidates(prefix):
            for gate, up, down in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
                w13 = {k: desc[k] for k in (f"{cand}.0.{gate}.weight", f"{cand}.0.{up}.weight") if k in desc}
                if w13 and f"{cand}.0.{down}.weight" in desc:
                    if len(set(map(str, w13.values()))) > 1:
                        return ERROR, (f"{where} gives {', '.join(w13)} different types; SGLang raises "
                                       f"'Mismatched ModelSlim quantization for W13 in layer {prefix}'")
                    types = (next(iter(w13.values())), desc[f"{cand}.0.{down}.weight"])
                    if not all(isinstance(t, str) and t in _MOE_SCHEMES for t in types):
                        return ERROR, (f"{where} gives {cand}.0 types {list(types)}; SGLang raises "
                                       f"'Unsupported ModelSlim MoE schemes for layer {prefix}'")
                    return QUANTIZED, f"{where}[{cand}.0.{gate}.weight] = {types[0]}"
        return ERROR, (f"{where} has no expert-0 entries under {prefix}; SGLang raises "
                       f"'Missing ModelSlim MoE quantization description for layer {prefix}'")
    if "vision_model" in prefix or "visual" in prefix or "vision_tower" in prefix or "mm_projector" in prefix:
        raise UnsupportedPattern("vision modules are renamed by ModelSlimConfig first")
    proj = prefix.rsplit(".", 1)[-1]
    names = [prefix.replace(proj, s) for s in packed[proj]] if proj in packed else [prefix]
    floats = [desc.get(_modelslim_resolve(desc, n) + ".weight", "") == "FLOAT" for n in names]
    if len(set(floats)) > 1:
        return ERROR, (f"{where} marks some shards of {prefix} FLOAT only; SGLang raises "
                       f"'Detected some but not all shards of {prefix} are quantized'")
    key = _modelslim_resolve(desc, names[0]) + ".weight"
    if floats[0]:
        return UNQUANTIZED, f"{where}[{key}] = FLOAT"
    scheme = desc.get(key, "")
    if isinstance(scheme, str) and scheme in _LINEAR_SCHEMES:
        return QUANTIZED, f"{where}[{key}] = {scheme}"
    return UNQUANTIZED, f"{where}[{key}] = {scheme!r}, no linear scheme SGLang knows"


SGLANG_PROCEDURES = {"auto_round_blocks": _auto_round_blocks, "modelslim_type_map": _modelslim}
