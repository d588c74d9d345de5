"""What one engine's quantization config decides for one module: quantized, unquantized, or a load error.

Each engine decides per quantization method, with its own reading of the declared lists; the rule
file says which procedure and which config keys a method uses (rules/quant/<engine>.yaml, each
entry citing the function it was read from). The procedures below
restate those functions for one module name as the engine asks it: the runtime module (a fused
``qkv_proj`` / ``gate_up_proj`` Linear, a whole ``...mlp.experts`` fused MoE), not a stored tensor.
tests/test_draft_quant_sglang.py checks every procedure against SGLang's own classes.

Entries come from the checkpoint, so every pattern runs on RE2 (ckptinspect/safe_regex.py); an entry
RE2 cannot evaluate makes the answer ``unknown`` instead of a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ckptinspect.quant.engine_decision_vllm import VLLM_PROCEDURES
from ckptinspect.quant.engine_decision_vllm_ct import VLLM_CT_PROCEDURES
from ckptinspect.quant.engine_decision_vllm_inc import VLLM_INC_PROCEDURES
from ckptinspect.records import DeclaredQuant
from ckptinspect import safe_regex
from ckptinspect.safe_regex import UnsupportedPattern, compile_re2, translate
from ckptinspect.quant.built_as import ERROR, QUANTIZED, UNKNOWN, UNQUANTIZED
from ckptinspect.quant.engine_decision_sglang import SGLANG_PROCEDURES


@dataclass(frozen=True)
class Decision:
    built: str  # QUANTIZED / UNQUANTIZED / ERROR / UNKNOWN
    why: str  # the config entry or rule responsible, for the finding
    source: str  # where the engine does this (rule file citation)


def method_rule(section: Mapping[str, Any] | None, method: str | None) -> Mapping[str, Any] | None:
    """The ``methods`` entry of an engine's rules/quant file for ``method`` (None: not modelled)."""
    if not section or method is None:
        return None
    return next((m for m in section.get("methods", ()) if method in m["methods"]), None)


def decide(section: Mapping[str, Any], rule: Mapping[str, Any], declared: DeclaredQuant, prefix: str,
           kind: str) -> Decision:
    """``kind``: ``linear`` or ``moe`` (a fused-MoE layer asked once under its ``...experts`` prefix)."""
    procedure = _PROCEDURES[rule["procedure"]]
    packed = section.get("packed", {})
    try:
        built, why = procedure(rule, declared, prefix, kind, packed)
    except UnsupportedPattern as exc:
        built, why = UNKNOWN, f"an entry the engine would evaluate cannot be (not evaluated: {exc})"
    return Decision(built, why, rule["source"])


def _entries(declared: DeclaredQuant, keys: list[str]) -> tuple[str, list[str]]:
    """(sources read, entries) of the declared lists under the config keys the engine reads."""
    sources, out = [], []
    for lst in declared.excludes:
        if lst.source.rsplit(".", 1)[-1] in keys:
            sources.append(lst.source)
            out.extend(lst.entries)
    return ", ".join(sources) or "no list the engine reads", out


# --- SG:layers/quantization/utils.py is_layer_skipped / _module_path_match -----------------------------

def _path_runs(prefix: str) -> set[str]:
    """Every run of consecutive dotted parts: ``"." + entry + "."`` occurs in ``"." + prefix + "."``
    exactly when the entry is one of them (_module_path_match, also covering equality and parents)."""
    parts = prefix.split(".")
    return {".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}


def _path_match_any(entries: list[str], prefix: str) -> str | None:
    """The first entry (trailing dots dropped, as _module_path_match does) naming a run of ``prefix``."""
    runs = _path_runs(prefix.rstrip("."))
    return next((e for e in entries if e.rstrip(".") in runs), None)


def _skipped(prefix: str, entries: list[str], packed: Mapping[str, list[str]]) -> tuple[bool | None, str]:
    """is_layer_skipped: None when the shards of a fused module disagree (SGLang raises ValueError)."""
    names = list(dict.fromkeys(entries))  # in the file's order: the entry a message names is stable
    proj = prefix.rsplit(".", 1)[-1]
    if proj in packed:
        hits = [_path_match_any(names, prefix.replace(proj, shard)) for shard in packed[proj]]
        if len({h is not None for h in hits}) > 1:
            return None, f"shards of {prefix} differ ({', '.join(packed[proj])}: " \
                         f"{', '.join('listed' if h else 'not listed' for h in hits)})"
        return hits[0] is not None, hits[0] or ""
    hit = _path_match_any(names, prefix)
    if hit is None and "gate_up_proj" in prefix:
        listed = set(names)
        if prefix.replace("gate_up_proj", "gate_proj") in listed and prefix.replace("gate_up_proj", "up_proj") in listed:
            hit = prefix.replace("gate_up_proj", "gate_proj")
    elif hit is None and "experts" in prefix:
        hit = next((e for e in entries if "experts" in e and prefix in e), None)
    return hit is not None, hit or ""


def _skip_list(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202 - procedure signature
    """Fp8Config: ``ignored_layers`` / ``modules_to_not_convert`` only, each entry also with and
    without a leading ``model.`` (Fp8Config.from_config)."""
    source, raw = _entries(declared, rule["lists"])
    entries = raw
    if rule.get("model_prefix_variants"):
        entries = [v for e in raw for v in (e.removeprefix("model."), "model." + e.removeprefix("model."))]
    skipped, hit = _skipped(prefix, entries, packed)
    if skipped is None:
        return ERROR, f"{source}: {hit}; SGLang raises 'Detected some but not all shards of {prefix} are quantized'"
    return (UNQUANTIZED, f"{source} entry {hit!r}") if skipped else (QUANTIZED, f"not in {source}")


# --- SG:layers/quantization/modelopt_quant.py ModelOptQuantConfig.is_layer_excluded ------------------

_FUSED_TAILS = frozenset({"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"})


@lru_cache(maxsize=64)
def _modelopt_regex(entries: tuple[str, ...]) -> Any:
    """One RE2 union of the entries as ModelOpt compiles them (``.`` literal, ``*`` -> ``.*``, every
    other character as written), matched in full."""
    if not entries:
        return None
    return compile_re2("|".join(f"(?:{translate(e.replace('.', chr(92) + '.').replace('*', '.*'))})"
                                for e in entries))


def _modelopt_excluded(entries: list[str], prefix: str) -> str | None:
    regex = _modelopt_regex(tuple(entries))
    if regex is None:
        return None
    candidates = [prefix] + ([prefix.removeprefix("language_model.")] if prefix.startswith("language_model.") else [])
    for pfx in candidates:
        for part in [pfx, *pfx.split(".")]:
            if regex.fullmatch(part):
                return next((e for e in entries if _fullmatch_one(e, part)), part)
    tail = prefix.rsplit(".", 1)[-1]
    return next((e for e in entries if e.rsplit(".", 1)[-1] in _FUSED_TAILS and e.rsplit(".", 1)[-1] in tail), None)


def _fullmatch_one(entry: str, name: str) -> bool:
    try:
        return _modelopt_regex((entry,)).fullmatch(name) is not None
    except UnsupportedPattern:
        return False


def _modelopt_exclude(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """ModelOpt FP8 / NVFP4: a Linear is skipped by is_layer_skipped or is_layer_excluded, a fused MoE
    by is_layer_excluded only (ModelOptQuantConfig._get_quant_method)."""
    source, entries = _entries(declared, rule["lists"])
    if kind == "linear":
        skipped, hit = _skipped(prefix, entries, packed)
        if skipped is None:
            return ERROR, f"{source}: {hit}; SGLang raises 'Detected some but not all shards of {prefix} are quantized'"
        if skipped:
            return UNQUANTIZED, f"{source} entry {hit!r}"
    hit = _modelopt_excluded(entries, prefix)
    return (UNQUANTIZED, f"{source} entry {hit!r}") if hit is not None else (QUANTIZED, f"not in {source}")


def _modelopt_mixed(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """MIXED_PRECISION: the exclude lists as above, then the module's own ``quantized_layers`` entry, a
    fused module's shards, or any listed child (ModelOptMixedPrecisionConfig._resolve_quant_algo);
    unlisted modules are unquantized."""
    layers = declared.quantized_layers
    proj = prefix.rsplit(".", 1)[-1]
    if proj in packed and prefix not in layers:  # _resolve_quant_algo runs before the exclusion checks
        base = prefix.rsplit(".", 1)[0]
        algos = {layers[f"{base}.{s}"] for s in packed[proj] if f"{base}.{s}" in layers}
        if len(algos) > 1:
            return ERROR, f"quantized_layers gives the shards of {prefix} {sorted(algos)}; SGLang raises 'Mixed quant_algo within fused layer'"
    built, why = _modelopt_exclude(rule, declared, prefix, kind, packed)
    if built != QUANTIZED:
        return built, why
    candidates = [prefix] + (["lm_head"] if prefix.endswith(".lm_head") else [])
    if any(c in layers for c in candidates):
        return QUANTIZED, f"quantized_layers[{prefix!r}] = {layers.get(prefix, layers.get('lm_head'))}"
    if proj in packed and any(f"{prefix.rsplit('.', 1)[0]}.{s}" in layers for s in packed[proj]):
        return QUANTIZED, f"quantized_layers lists the shards of {prefix}"
    child = next((k for k in layers if k.startswith(prefix + ".")), None)
    if child is not None:
        return QUANTIZED, f"quantized_layers lists {child!r}"
    return UNQUANTIZED, f"{prefix} not in quantized_layers"


# --- SG:layers/quantization/compressed_tensors/ (utils.py should_ignore_layer, find_matched_target) -


def _first_regex(name: str, entries: list[str]) -> str | None:
    """The first ``re:`` entry that re.matches ``name``."""
    regexes = [e for e in entries if e.startswith("re:")]
    index = safe_regex.first_match_index(name, tuple(e[3:] for e in regexes))
    return None if index is None else regexes[index]


def _ct_match(name: str, targets: list[str]) -> str | None:
    """check_equal_or_regex_match: equal, a dotted suffix, or ``re:`` + re.match."""
    plain = set(targets)
    parts = name.split(".")
    suffix = next((".".join(parts[i:]) for i in range(len(parts)) if ".".join(parts[i:]) in plain), None)
    return suffix if suffix is not None and not suffix.startswith("re:") else _first_regex(name, targets)


def _ct_targets_ignore(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """compressed-tensors: ``ignore`` first (a fused Linear's shards must agree), then the config
    groups' ``targets`` (the class name ``Linear`` covers every Linear and fused MoE; a name or ``re:``
    target must match the module); no target is a load error ('Unable to find matching target'). A
    fused MoE is resolved through expert 0's gate / up / down projections, which must agree."""
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    ignore = [str(x) for x in raw.get("ignore") or ()]
    groups = raw.get("config_groups") if isinstance(raw.get("config_groups"), Mapping) else {}
    targets = [str(t) for g in groups.values() if isinstance(g, Mapping) for t in g.get("targets") or ()]
    if kind == "moe":
        answers = [_ct_linear(f"{prefix}.0.{p}", ignore, targets, {}) for p in ("gate_proj", "up_proj", "down_proj")]
        failed = next((a for a in answers if a[0] == ERROR), None)
        if failed is not None:
            return failed
        if len({a[0] for a in answers}) > 1:
            return ERROR, (f"ignore / targets give the projections of {prefix}.0 different schemes; SGLang raises "
                           "'All MoE projections need to have same quantization scheme'")
        return answers[0]
    return _ct_linear(prefix, ignore, targets, packed)


def _ct_ignored(prefix: str, ignore: list[str], packed: Mapping[str, list[str]],
                ) -> tuple[list[str], str | None, tuple[str, str] | None]:
    """should_ignore_layer for a Linear: (the names asked, a fused Linear's shards unless it is ignored
    whole; the ignore entry that matched, None for none; the load error when only some shards are)."""
    proj = prefix.rsplit(".", 1)[-1]
    names = [prefix.replace(proj, s) for s in packed[proj]] if proj in packed and prefix not in ignore else [prefix]
    hits = [_ct_match(n, ignore) for n in names]
    if len({h is not None for h in hits}) > 1:
        return names, None, (ERROR, f"ignore lists some shards of {prefix} only; SGLang raises "
                             "'Found different quantization schemes ... requires all to use the same scheme'")
    return names, hits[0], None


def _ct_linear(prefix: str, ignore: list[str], targets: list[str], packed: Mapping[str, list[str]]) -> tuple[str, str]:
    names, hit, error = _ct_ignored(prefix, ignore, packed)
    if error is not None:
        return error
    if hit is not None:
        return UNQUANTIZED, f"ignore entry {hit!r}"
    if "Linear" in targets:
        return QUANTIZED, "config_groups target 'Linear'"
    named = [t for t in targets if t not in ("Linear", "FusedMoE", "DeepEPMoE")]
    hit = _ct_match(prefix, named) or next((h for h in (_ct_match(n, named) for n in names) if h), None)
    if hit is None:
        return ERROR, (f"{prefix} is in no config_groups target and not in ignore; SGLang raises "
                       f"'Unable to find matching target for {prefix} in the compressed-tensors config.'")
    return QUANTIZED, f"config_groups target {hit!r}"


def _ct_ignore_only(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """SGLang's W8A8Int8Config: compressed-tensors' ``should_ignore_layer`` on its ``ignore`` list (a
    fused Linear's shards must agree), every other Linear and fused MoE quantized. An ignored fused MoE
    is handed ``UnquantizedLinearMethod``, whose ``create_weights`` FusedMoE calls with MoE keywords
    (SG:layers/moe/fused_moe_triton/layer.py FusedMoE.__init__): the load fails with a TypeError."""
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    ignore = [str(x) for x in raw.get("ignore") or ()]
    _, hit, error = _ct_ignored(prefix, ignore, packed)
    if error is not None:
        return error
    if hit is None:
        return QUANTIZED, "not in ignore"
    if kind == "moe":
        return ERROR, (f"ignore entry {hit!r} gives the fused MoE {prefix} a Linear's unquantized method; "
                       "SGLang fails at startup (TypeError in create_weights)")
    return UNQUANTIZED, f"ignore entry {hit!r}"


# --- GPTQ dynamic, AWQ modules_to_not_convert, Quark exclude (AutoRound, ModelSlim: engine_decision_sglang.py)

def _dynamic_first_match(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """GPTQ(-Marlin) ``dynamic``: the first key whose regex re.matches the module decides (``-:`` leaves
    it unquantized, any other key only overrides parameters); a fused MoE ignores ``dynamic`` and is
    always built quantized (SG:layers/quantization/gptq/gptq.py GPTQMarlinConfig.get_quant_method)."""
    if kind == "moe":
        return QUANTIZED, "a fused MoE is built quantized whatever `dynamic` says"
    raw = declared.raw if isinstance(declared.raw, Mapping) else {}
    dynamic = raw.get("dynamic") if isinstance(raw.get("dynamic"), Mapping) else {}
    keys = [str(k) for k in dynamic]
    index = safe_regex.first_match_index(prefix, tuple(k[2:] if k.startswith(("-:", "+:")) else k for k in keys))
    if index is None:
        return QUANTIZED, "no dynamic key matches"
    if keys[index].startswith("-:"):
        return UNQUANTIZED, f"dynamic key {keys[index]!r}"
    return QUANTIZED, f"dynamic key {keys[index]!r} (first match, an override)"


def _substring_list(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """AWQ(-Marlin) ``modules_to_not_convert``: an entry anywhere in the module name, as a plain
    substring (SG:layers/quantization/awq/awq.py is_layer_skipped_awq)."""
    source, entries = _entries(declared, rule["lists"])
    hit = next((e for e in entries if e in prefix), None)
    return (UNQUANTIZED, f"{source} entry {hit!r}") if hit is not None else (QUANTIZED, f"not in {source}")


def _quark_match(name: str, entries: list[str]) -> str | None:
    """quark/utils.py _is_equal_or_regex_match: equal, or ``re:`` + re.match (no suffix rule)."""
    return name if name in set(entries) else _first_regex(name, entries)


def _quark_exclude(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN202
    """Quark ``exclude``: the module itself, any entry naming one of its experts (a fused MoE), or
    every shard of a fused Linear (shards that disagree raise); everything else gets a layer / type /
    global config (SG:layers/quantization/quark/utils.py should_ignore_layer, quark.py get_quant_method)."""
    source, entries = _entries(declared, rule["lists"])
    hit = _quark_match(prefix, entries)
    if hit is None and prefix.endswith(".experts"):
        hit = next((e for e in entries if e.startswith(prefix + ".")), None)
    proj = prefix.rsplit(".", 1)[-1]
    if hit is None and proj in packed:
        hits = [_quark_match(prefix.replace(proj, s), entries) for s in packed[proj]]
        if len({h is not None for h in hits}) > 1:
            return ERROR, (f"{source} lists some shards of {prefix} only; SGLang raises "
                           "'Found different quantization schemes ... requires all to use the same scheme'")
        hit = hits[0]
    return (UNQUANTIZED, f"{source} entry {hit!r}") if hit is not None else (QUANTIZED, f"not in {source}")


_PROCEDURES = {
    "skip_list": _skip_list,
    "modelopt_exclude": _modelopt_exclude,
    "modelopt_mixed": _modelopt_mixed,
    "ct_targets_ignore": _ct_targets_ignore,
    "dynamic_first_match": _dynamic_first_match,
    "substring_list": _substring_list,
    "quark_exclude": _quark_exclude,
    "ct_ignore_only": _ct_ignore_only,
    **SGLANG_PROCEDURES,
}
# vLLM's own procedures where it decides differently (rules/quant/vllm.yaml).
_PROCEDURES.update(VLLM_PROCEDURES)
_PROCEDURES.update(VLLM_CT_PROCEDURES)
_PROCEDURES.update(VLLM_INC_PROCEDURES)
PROCEDURES = frozenset(_PROCEDURES)
