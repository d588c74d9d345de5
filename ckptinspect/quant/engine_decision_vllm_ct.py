"""vLLM's compressed-tensors decision for one module: ``ignore``, then the config groups' ``targets``.

Kept apart from engine_decision_vllm.py (the other vLLM procedures, whose helpers it shares) for size;
registered into engine_decision's PROCEDURES table like them. Checked against vLLM's own
CompressedTensorsConfig by tests/test_draft_quant_vllm.py.

Shorthand: VL: = vllm-project/vllm:vllm/model_executor/layers/quantization/ at v0.33.0.
"""

from __future__ import annotations

from typing import Mapping

from ckptinspect import safe_regex
from ckptinspect.quant.built_as import ERROR, QUANTIZED, UNQUANTIZED
from ckptinspect.quant.engine_decision_vllm import _SCHEMES_DIFFER, _ct_ignored, _equal_or_regex, _raw


def _ct_group(name: str, kind: str, groups: list[tuple[str, list[str]]], packed: Mapping[str, list[str]]) -> tuple[str | None, str]:
    """find_matched_target: (config group, target) by the name, by all shards of a fused name, or by the
    layer class (``target in class name``, case-folded; a ``Linear`` target also covers RoutedExperts)."""
    targets = [(g, t) for g, ts in groups for t in ts]
    names = [t for _, t in targets]
    hit = _equal_or_regex(name, names)
    if hit is not None:
        return next(g for g, t in targets if t == hit), hit
    fused = next((f for f in packed if name.endswith(f)), None)
    if fused is not None:
        shard_hits = [_equal_or_regex(name.replace(fused, s), names) for s in packed[fused]]
        if all(shard_hits):
            return next(g for g, t in targets if t == shard_hits[0]), shard_hits[0]
    # A "Linear" target also keys the routed experts, as "RoutedExperts" after every other target
    # (CompressedTensorsConfig._add_fused_moe_to_target_scheme_map).
    classes, order = (_LINEAR_CLASSES, names)
    if kind == "moe":
        extra = "Linear" in names and "RoutedExperts" not in names
        classes, order = ("RoutedExperts",), names + (["RoutedExperts"] if extra else [])
        targets = targets + ([(next(g for g, t in targets if t == "Linear"), "RoutedExperts")] if extra else [])
    for target in order:
        hits = sum(_class_match(c, target) for c in classes)
        if hits == len(classes):
            return next(g for g, t in targets if t == target), target
        if hits:
            raise safe_regex.UnsupportedPattern(f"target {target!r} matches some Linear classes only: the answer "
                                                "depends on the layer's class")
    return None, ""


# The Linear classes vLLM's models build MTP projections with (VL:../linear.py).
_LINEAR_CLASSES = ("QKVParallelLinear", "MergedColumnParallelLinear", "RowParallelLinear", "ColumnParallelLinear",
                   "ReplicatedLinear")


def _class_match(cls: str, target: str) -> bool:
    """is_equal_or_regex_match(cls, target, check_contains=True): ``re:`` re.match, else case-folded containment."""
    return safe_regex.match(target[3:], cls) if target.startswith("re:") else target.lower() in cls.lower()


def vllm_ct_targets_ignore(rule, declared, prefix, kind, packed):  # noqa: ANN001, ANN201
    """compressed-tensors: ``ignore`` (equal or ``re:``; a fused Linear by its name or all shards), then
    the first matching ``targets`` entry; a module no target matches is built unquantized - no error,
    unlike SGLang. The routed experts are asked through expert 0's gate / up / down projections, whose
    groups must agree (VL:compressed_tensors/compressed_tensors.py get_quant_method, get_scheme_dict;
    VL:compressed_tensors/compressed_tensors_moe/compressed_tensors_moe.py get_moe_method)."""
    raw = _raw(declared)
    ignore = [str(x) for x in raw.get("ignore") or ()]
    cfg_groups = raw.get("config_groups") if isinstance(raw.get("config_groups"), Mapping) else {}
    groups = [(str(g), [str(t) for t in v.get("targets") or ()]) for g, v in cfg_groups.items() if isinstance(v, Mapping)]
    weighted = {str(g) for g, v in cfg_groups.items() if isinstance(v, Mapping) and v.get("weights") is not None}

    def one(name: str, moe: bool) -> tuple[str | None, str]:
        ignored, hit = _ct_ignored(name, ignore, {} if moe else packed)
        if ignored is None:
            raise _Raise(f"{hit}; {_SCHEMES_DIFFER.format(name)}")
        if ignored:
            return None, f"ignore entry {hit!r}"
        group, target = _ct_group(name, "moe" if moe else "linear", groups, {} if moe else packed)
        if group is None:
            return None, f"{name} is in no config_groups target and not in ignore: vLLM builds it unquantized"
        return (group, f"config_groups target {target!r}") if group in weighted else (None, f"group {group} has no weights")

    try:
        if kind == "moe":
            answers = [one(f"{prefix}.0.{p}", True) for p in ("gate_proj", "up_proj", "down_proj")]
            if len({a[0] for a in answers}) > 1:
                return ERROR, (f"ignore / targets give the projections of {prefix}.0 different schemes; vLLM raises "
                               "'All MoE projections need to have same quantization scheme'")
            group, why = answers[-1]
        else:
            group, why = one(prefix, False)
    except _Raise as exc:
        return ERROR, str(exc)
    return (QUANTIZED if group is not None else UNQUANTIZED), why


class _Raise(Exception):
    """vLLM raises for the module (the message is the cause)."""


VLLM_CT_PROCEDURES = {"vllm_ct_targets_ignore": vllm_ct_targets_ignore}
