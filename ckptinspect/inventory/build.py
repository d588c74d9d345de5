"""Shard scans -> Inventory: merge groups across shards, classify, place MTP layers, detect schemes."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from functools import cache
from typing import Iterable

from ckptinspect.inventory.classify import (
    COMPANION_ROLES, attention_kind, component_of, expert_slot, split_role,
)
from ckptinspect.inventory.mtp_prefix import MtpPrefix, assign_mtp
from ckptinspect.inventory.scan import GroupTally, ShardScan
from ckptinspect.quant.detect import UNQUANTIZED, Part, detect_scheme, logical_params, weight_part
from ckptinspect.records import Finding, Inventory, ModelConfig, ShardInfo, TensorGroup, Totals

_Key = tuple[str, "int | None"]


def build_inventory(scans: Iterable[ShardScan], config: ModelConfig,
                    prefixes: tuple[MtpPrefix, ...]) -> tuple[Inventory, list[Finding]]:
    """Merge per-shard scans into TensorGroups with component, MTP layer and scheme."""
    merged: dict[_Key, GroupTally] = {}
    shards_of: dict[_Key, set[str]] = defaultdict(set)
    shard_infos = []
    for scan in scans:
        shard_infos.append(ShardInfo(scan.shard, scan.header_length, scan.file_size, scan.tensors, scan.data_bytes))
        for key, tally in scan.groups.items():
            shards_of[key].add(scan.shard)
            have = merged.get(key)
            merged[key] = tally if have is None else have.merged(tally)

    layers = config.num_hidden_layers
    # Module-level view: (module pattern, index) -> {suffix: Part} decides the scheme.
    modules: dict[tuple[str, int | None], dict[str, Part]] = defaultdict(dict)
    split: dict[_Key, tuple[str, str, str]] = {}
    # Classification is a function of the pattern alone, and one pattern recurs once per layer: 80
    # distinct patterns for the 2,021 groups of the 60-layer Qwen3.5-397B replica, so each is classified once.
    role_of, component_for = cache(split_role), cache(component_of)
    for key, acc in merged.items():
        module, suffix, role = split[key] = role_of(key[0])
        # a group whose members mix dtypes is the scheme of its most common dtype; the others are per member
        dtype = acc.dtype if acc.member_dtypes is None else Counter(acc.member_dtypes).most_common(1)[0][0]
        modules[(module, key[1])][suffix] = Part(role, suffix, dtype, tuple(acc.shape), acc.tensors)
    schemes = {mk: detect_scheme(parts) for mk, parts in modules.items()}

    findings: list[Finding] = []
    groups = []
    for key, acc in merged.items():
        pattern, index = key
        module, suffix, role = split[key]
        scheme = schemes[(module, index)]
        member_schemes = _member_schemes(modules[(module, index)], suffix, acc.member_dtypes) \
            if acc.member_dtypes is not None and len(acc.member_dtypes) == len(acc.subs) else ()
        mtp = assign_mtp(pattern, index, prefixes, layers)
        layer = index if (mtp is None and index is not None and _is_layer_pattern(pattern)) else None
        component = component_for(module)
        kind, experts = _kind_and_experts(component, pattern, role, acc.subs, acc.shape, config, layer)
        dtypes = tuple(sorted(acc.dtypes)) if acc.dtypes else (acc.dtype,)
        params = 0 if role in COMPANION_ROLES or role == "other_companion" else logical_params(
            scheme, role, acc.dtype, acc.elements)
        groups.append(TensorGroup(
            pattern=pattern, index=index, component=component, role=role, module=module, layer=layer,
            mtp_layer=mtp, dtypes=dtypes, shape=tuple(acc.shape), tensors=acc.tensors, bytes=acc.bytes,
            elements=acc.elements, params=params, scheme=scheme, subs=tuple(acc.subs),
            shards=frozenset(shards_of[key]), shapes_vary=acc.shapes_vary, kind=kind, experts=experts,
            member_schemes=member_schemes,
        ))
        if acc.dtypes:
            findings.append(Finding("mixed-dtypes-in-group", "warning",
                                    f"{_show(pattern, index)} mixes dtypes {', '.join(dtypes)}",
                                    subject=_show(pattern, index)))
    findings.extend(_companion_mismatches(modules))
    groups.sort(key=lambda g: (g.mtp_layer is not None, g.mtp_layer or 0, g.layer if g.layer is not None else -1,
                               g.pattern, g.index if g.index is not None else -1))
    totals = Totals(
        tensors=sum(g.tensors for g in groups), params=sum(g.params for g in groups),
        bytes=sum(g.bytes for g in groups),
    )
    return Inventory(groups=tuple(groups), shards=tuple(shard_infos), totals=totals), findings


def _is_layer_pattern(pattern: str) -> bool:
    head = pattern.split("{}", 1)[0]
    return head.endswith(("layers.", "layer.", "h.", "blocks.", "block.", "decoder.layers."))


def _kind_and_experts(component: str, pattern: str, role: str, subs: list, shape: list,
                      config: ModelConfig, layer: int | None) -> tuple[str, int | None]:
    if component == "attention":
        layer_type = config.layer_types[layer] if layer is not None and layer < len(config.layer_types) else None
        return attention_kind(pattern, config.attention_kind, layer_type), None
    if component != "routed_expert" or role != "weight":
        return ("", None)
    slot = expert_slot(pattern)
    if slot is not None and slot >= 1:
        if subs and isinstance(subs[0], int):  # one sub-index per member: it is the expert id
            return "per_expert", len(set(subs)) if slot == 1 else None
        ids = {sub[slot - 1] for sub in subs if len(sub) >= slot}
        return "per_expert", len(ids)
    if len(shape) >= 3:
        return "grouped", shape[0]
    return "per_expert", None


def _member_schemes(parts: dict[str, Part], suffix: str, member_dtypes: list[str]) -> tuple[str, ...]:
    """Each member's scheme (``member_dtypes`` order) when ``suffix`` is the module's weight and its
    members are stored unlike each other (the companions are the module's, as stored); else (). A member
    whose dtype differs from the group's but gives the same quantized scheme is ``scheme/DTYPE`` (an
    F8_E5M2 expert among F8_E4M3 ones: the engine's parameter holds the group's codes, and copying other
    codes into it converts them)."""
    weight = weight_part(parts)
    if weight is None or weight.suffix != suffix:
        return ()
    schemes = {d: detect_scheme({**parts, suffix: replace(weight, dtype=d)}) for d in set(member_dtypes)}
    group = schemes[weight.dtype]
    labels = {d: f"{s}/{d}" if s == group and d != weight.dtype and s not in UNQUANTIZED else s
              for d, s in schemes.items()}
    if len(set(labels.values())) < 2:
        return ()
    return tuple(map(labels.__getitem__, member_dtypes))


def _companion_mismatches(modules: dict) -> list[Finding]:
    """A quantized module whose scale companions are fewer than its weights (partially stored)."""
    out = []
    for (module, index), parts in modules.items():
        weight = parts.get(".weight") or parts.get(".weight_packed") or parts.get(".qweight")
        if weight is None:
            continue
        for suffix in (".weight_scale", ".weight_scale_inv", ".weight_scale_2", ".weight_global_scale", ".scale"):
            companion = parts.get(suffix)
            if companion is not None and companion.tensors != weight.tensors:
                where = _show(module, index)
                out.append(Finding(
                    "quant-companion-count-mismatch", "error",
                    f"{where}: {weight.tensors} weights but {companion.tensors} '{suffix[1:]}' tensors "
                    "(part of the module is stored in another precision)", subject=where))
    return out


def _show(pattern: str, index: int | None) -> str:
    if index is None:
        return pattern
    return pattern.replace("{}", str(index), 1).replace("{}", "N")
