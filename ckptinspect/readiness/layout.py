"""MTP layout matching: which MTP layers a checkpoint holds and whether each is complete.

Works on the inventory's groups (a few hundred), never per tensor: a required sub-module is
looked up as a (pattern prefix, leading index) key, expert coverage is read from ``sub_indices``
(per-expert storage) or from dim 0 of a grouped 3-D tensor, so verdicts cannot depend on tensor
order, shard names or the expert storage style.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from ckptinspect.readiness.model import MtpLayout, Requirement
from ckptinspect.inventory.mtp_prefix import concrete_prefix
from ckptinspect.records import ModelConfig, TensorGroup

_EXPERT = "\x00"  # stands for {e} while a required name is turned into a key

Key = tuple[str, "int | None"]


def name_key(name: str) -> tuple[str, int | None, int | None]:
    """(pattern, leading index, slot of {e}) of a concrete name, numbers replaced by ``{}``."""
    parts, first, expert_slot, slots = [], None, None, 0
    for part in name.split("."):
        if part.isdigit():
            parts.append("{}")
            if first is None:
                first = int(part)
            slots += 1
        elif part == _EXPERT:
            parts.append("{}")
            expert_slot = slots
            slots += 1
        else:
            parts.append(part)
    return ".".join(parts), first, expert_slot


def prefix_keys(groups: Iterable[TensorGroup]) -> set[Key]:
    """Every dotted prefix of every group pattern, keyed with the index when the prefix has one."""
    keys: set[Key] = set()
    for g in groups:
        parts = g.pattern.split(".")
        for end in range(1, len(parts) + 1):
            pref = ".".join(parts[:end])
            keys.add((pref, g.index if "{}" in pref else None))
    return keys


@dataclass(frozen=True)
class LayerScan:
    """One present MTP layer, matched against the family layout."""

    k: int
    base: str  # concrete base the layout's relative names hang off ("model.layers.61.", "mtp.")
    groups: tuple[TensorGroup, ...]
    missing: tuple[str, ...]  # labels of unmet requirements
    experts_present: int | None
    experts_expected: int | None
    missing_experts: tuple[int, ...]  # ids when stored per expert; empty when only a count is known
    experts_short: int  # experts_expected - experts_present (0 when complete or unknown)

    def relative(self, module: str) -> str | None:
        """``module`` relative to this layer's base, None when it lies elsewhere."""
        return module[len(self.base):] if module.startswith(self.base) else None


def found_prefix(groups: tuple[TensorGroup, ...]) -> str:
    """Concrete dotted prefix shared by all ``groups`` (``model.layers.61.``)."""
    patterns = [g.pattern for g in groups]
    lo, hi = min(patterns), max(patterns)
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    common = lo[:n][: lo[:n].rfind(".") + 1]
    index = next((g.index for g in groups if g.index is not None), None)
    return common.replace("{}", str(index), 1) if index is not None else common


def _has_k(template: str) -> bool:
    return "{k}" in template or "{L+k}" in template


def _bases(layout: MtpLayout) -> tuple[str, ...]:
    base = layout.base
    if base is None:
        return ()
    return (base,) if isinstance(base, str) else tuple(base)


def expected_experts(layout: MtpLayout, config: ModelConfig) -> int | None:
    if layout.experts is None:
        return None
    for key in layout.experts.count_keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return config.routed_experts


def scan_layers(groups: Iterable[TensorGroup], layout: MtpLayout, config: ModelConfig) -> dict[int, LayerScan]:
    """Group MTP tensor groups by layer and check each layer against ``layout``."""
    by_k: dict[int, list[TensorGroup]] = defaultdict(list)
    for g in groups:
        if g.mtp_layer is not None:
            by_k[g.mtp_layer].append(g)
    layers = config.num_hidden_layers
    expected = expected_experts(layout, config)
    out: dict[int, LayerScan] = {}
    for k in sorted(by_k):
        members = tuple(sorted(by_k[k], key=lambda g: (g.pattern, g.index if g.index is not None else -1)))
        keys = prefix_keys(members)
        base_template, base = _choose_base(layout, keys, layers, k)
        if base_template is None:  # generic scan: the common prefix of what was found
            base = found_prefix(members)
        shared_once = base_template is not None and not _has_k(base_template)
        missing = [req.label for req in layout.required
                   if not _requirement_met(req, base, k, keys, skip_shared=shared_once and k > 0)]
        present, ids_missing, short = _experts(layout, base, k, members, expected)
        out[k] = LayerScan(k=k, base=base, groups=members, missing=tuple(missing), experts_present=present,
                           experts_expected=expected if layout.experts is not None else None,
                           missing_experts=ids_missing, experts_short=short)
    return out


def _choose_base(layout: MtpLayout, keys: set[Key], layers: int, k: int) -> tuple[str | None, str]:
    bases = _bases(layout)
    for template in bases:
        concrete = concrete_prefix(template, layers, k)
        pattern, index, _ = name_key(concrete.rstrip("."))
        if not concrete.rstrip(".") or (pattern, index) in keys:
            return template, concrete
    if bases:
        return bases[0], concrete_prefix(bases[0], layers, k)
    return None, ""


def _rel_key(base: str, rel: str, k: int) -> tuple[str, int | None, int | None]:
    return name_key(base + rel.replace("{k}", str(k)).replace("{e}", _EXPERT))


def _requirement_met(req: Requirement, base: str, k: int, keys: set[Key], *, skip_shared: bool) -> bool:
    for alternative in req.alternatives:
        if skip_shared and not any("{k}" in rel for rel in alternative):
            return True  # a module shared by all MTP layers (e.g. mtp.fc) is checked on layer 0 only
        if all(_rel_key(base, rel, k)[:2] in keys for rel in alternative):
            return True
    return False


def _experts(layout: MtpLayout, base: str, k: int, members: tuple[TensorGroup, ...],
             expected: int | None) -> tuple[int | None, tuple[int, ...], int]:
    """(experts present, missing ids, shortfall) for one MTP layer."""
    spec = layout.experts
    if spec is None:
        return None, (), 0
    per_projection: list[set[int]] = []
    for rel in spec.per_expert:
        pattern, index, slot = _rel_key(base, rel, k)
        ids: set[int] = set()
        found = False
        for g in members:
            if (g.pattern == pattern or g.pattern.startswith(pattern + ".")) and (index is None or g.index == index):
                found = True
                if slot == 0:
                    ids.add(g.index if g.index is not None else -1)
                elif slot is not None:
                    ids.update(sub[slot - 1] for sub in g.sub_indices if len(sub) >= slot)
        if found:
            per_projection.append(ids)
    if per_projection and len(per_projection) == len(spec.per_expert):
        present_ids = set.intersection(*per_projection)
        missing = tuple(sorted(set(range(expected)) - present_ids)) if expected else ()
        return len(present_ids), missing, len(missing)
    for alternative in spec.grouped:
        counts = []
        for rel in alternative:
            pattern, index, _ = _rel_key(base, rel, k)
            hits = [g for g in members if (g.pattern == pattern or g.pattern.startswith(pattern + "."))
                    and (index is None or g.index == index) and g.shape]
            if not hits:
                break
            counts.append(min(g.shape[0] for g in hits))
        else:
            present = min(counts)
            return present, (), max(0, (expected or present) - present)
    if per_projection:  # some projections stored per expert, others missing entirely
        return 0, tuple(range(expected)) if expected else (), expected or 0
    return 0, tuple(range(expected)) if expected else (), expected or 0
