"""Compare two checkpoints (typically a BF16 original and its quantized export).

Works on modules, not tensors: a quantized export renames or adds parameters (``weight_packed``,
``weight_scale``, ...) but keeps module names, so modules are matched by (module pattern, leading
index) and summarised per pattern (``model.layers.{}.mlp.experts.{}.down_proj``) with the layers
they occur in. Reports scheme changes, modules that disappeared (above all the MTP layer) or
appeared, declared exclude-list differences and the size change.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ckptinspect.records import Checkpoint, Finding, MtpAssessment, TensorGroup

_WEIGHT_ROLES = ("weight", "other")


@dataclass(frozen=True)
class ModuleState:
    component: str
    scheme: str
    tensors: int
    bytes: int
    params: int
    mtp: bool


@dataclass(frozen=True)
class PatternChange:
    """One module pattern whose state differs between A and B, over the layers listed."""

    component: str
    module: str  # pattern with {} for numeric segments
    layers: tuple[int, ...]  # leading indices (decoder / MTP layer); empty for non-layer modules
    before: str | None  # scheme in A (None: absent from A)
    after: str | None  # scheme in B (None: absent from B)
    bytes_a: int
    bytes_b: int
    mtp: bool

    def to_json(self) -> dict[str, Any]:
        return {"component": self.component, "module": self.module, "layers": compact_ranges(self.layers),
                "before": self.before, "after": self.after, "bytes_a": self.bytes_a, "bytes_b": self.bytes_b,
                "mtp": self.mtp}


@dataclass(frozen=True)
class Side:
    ref: str
    family: str | None
    label: str | None  # declared quantization label
    tensors: int
    params: int
    bytes: int
    mtp_layers: int
    mtp_tensors: int
    mtp_bytes: int
    excludes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "family": self.family, "declared_quant": self.label, "tensors": self.tensors,
                "params": self.params, "bytes": self.bytes,
                "mtp": {"layers": self.mtp_layers, "tensors": self.mtp_tensors, "bytes": self.mtp_bytes},
                "exclude_entries": len(self.excludes)}


@dataclass(frozen=True)
class CheckpointDiff:
    a: Side
    b: Side
    scheme_changes: tuple[PatternChange, ...]
    removed: tuple[PatternChange, ...]
    added: tuple[PatternChange, ...]
    excludes_only_a: tuple[str, ...]
    excludes_only_b: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def bytes_delta(self) -> int:
        return self.b.bytes - self.a.bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.to_json(), "b": self.b.to_json(),
            "size": {"bytes_a": self.a.bytes, "bytes_b": self.b.bytes, "bytes_delta": self.bytes_delta,
                     "ratio": round(self.b.bytes / self.a.bytes, 6) if self.a.bytes else None},
            "scheme_changes": [c.to_json() for c in self.scheme_changes],
            "removed": [c.to_json() for c in self.removed],
            "added": [c.to_json() for c in self.added],
            "excludes": {"only_a": list(self.excludes_only_a), "only_b": list(self.excludes_only_b)},
            "findings": [f.to_json() for f in self.findings],
        }


def compact_ranges(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    nums = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


def canonical_module(g: TensorGroup) -> str:
    """Routed experts compare as one ``...experts`` container per layer, so per-expert
    (``experts.{}.down_proj``) and grouped (``experts.down_proj``) storage are the same module."""
    if g.component == "routed_expert":
        cut = g.module.find(".experts")
        if cut >= 0:
            return g.module[: cut + len(".experts")]
    return g.module


def module_states(groups: Iterable[TensorGroup]) -> dict[tuple[str, int | None], ModuleState]:
    """(module pattern, index) -> state; the scheme is the weights', sizes include companions."""
    acc: dict[tuple[str, int | None], dict[str, Any]] = {}
    for g in groups:
        key = (canonical_module(g), g.index)
        st = acc.setdefault(key, {"component": g.component, "schemes": set(), "fallback": g.scheme, "tensors": 0,
                                  "bytes": 0, "params": 0, "mtp": False})
        st["tensors"] += g.tensors
        st["bytes"] += g.bytes
        st["params"] += g.params
        st["mtp"] = st["mtp"] or g.mtp_layer is not None
        if g.role in _WEIGHT_ROLES:
            st["schemes"].add(g.scheme)
    return {k: ModuleState(component=v["component"], scheme="/".join(sorted(v["schemes"])) or v["fallback"],
                           tensors=v["tensors"], bytes=v["bytes"], params=v["params"], mtp=v["mtp"])
            for k, v in acc.items()}


def _summarise(items: list[tuple[tuple[str, int | None], ModuleState | None, ModuleState | None]]) -> list[PatternChange]:
    buckets: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: {"layers": set(), "a": 0, "b": 0})
    for (module, index), sa, sb in items:
        ref = sa or sb
        assert ref is not None
        key = (ref.component, module, sa.scheme if sa else None, sb.scheme if sb else None, ref.mtp)
        bucket = buckets[key]
        if index is not None:
            bucket["layers"].add(index)
        bucket["a"] += sa.bytes if sa else 0
        bucket["b"] += sb.bytes if sb else 0
    out = [PatternChange(component=k[0], module=k[1], layers=tuple(sorted(v["layers"])), before=k[2], after=k[3],
                         bytes_a=v["a"], bytes_b=v["b"], mtp=k[4]) for k, v in buckets.items()]
    return sorted(out, key=lambda c: (not c.mtp, -(c.bytes_a + c.bytes_b), c.module))


def _side(ck: Checkpoint, mtp: MtpAssessment | None) -> Side:
    excludes = tuple(sorted({e for lst in ck.declared.excludes for e in lst.entries}))
    return Side(ref=ck.ref, family=ck.family, label=ck.declared.label, tensors=ck.inventory.totals.tensors,
                params=ck.inventory.totals.params, bytes=ck.inventory.totals.bytes,
                mtp_layers=mtp.present_layers if mtp else len({g.mtp_layer for g in ck.inventory.mtp_groups()}),
                mtp_tensors=sum(g.tensors for g in ck.inventory.mtp_groups()),
                mtp_bytes=sum(g.bytes for g in ck.inventory.mtp_groups()), excludes=excludes)


def diff_checkpoints(a: Checkpoint, b: Checkpoint, mtp_a: MtpAssessment | None = None,
                     mtp_b: MtpAssessment | None = None) -> CheckpointDiff:
    """Compare ``a`` (reference, e.g. BF16) with ``b`` (e.g. its quant)."""
    sa, sb = module_states(a.inventory.groups), module_states(b.inventory.groups)
    changed = [(k, sa[k], sb[k]) for k in sa.keys() & sb.keys() if sa[k].scheme != sb[k].scheme]
    removed = [(k, sa[k], None) for k in sa.keys() - sb.keys()]
    added = [(k, None, sb[k]) for k in sb.keys() - sa.keys()]
    side_a, side_b = _side(a, mtp_a), _side(b, mtp_b)
    only_a = tuple(e for e in side_a.excludes if e not in set(side_b.excludes))
    only_b = tuple(e for e in side_b.excludes if e not in set(side_a.excludes))
    findings = _findings(side_a, side_b, removed)
    return CheckpointDiff(a=side_a, b=side_b, scheme_changes=tuple(_summarise(changed)),
                          removed=tuple(_summarise(removed)), added=tuple(_summarise(added)),
                          excludes_only_a=only_a, excludes_only_b=only_b, findings=tuple(findings))


def _findings(a: Side, b: Side, removed: list[Any]) -> list[Finding]:
    out = []
    if a.mtp_layers and not b.mtp_layers:
        out.append(Finding("mtp-dropped", "error",
                           f"B has no MTP layer although A ships {a.mtp_layers} ({a.mtp_tensors} tensors, "
                           f"{a.mtp_bytes:,} bytes); speculative decoding with B would draft from missing weights",
                           hint="graft A's MTP tensors into B and add their prefix to B's exclude list",
                           reference="mtp_families.md D1"))
    elif b.mtp_layers < a.mtp_layers:
        out.append(Finding("mtp-layers-dropped", "warning",
                           f"B ships {b.mtp_layers} MTP layer(s), A {a.mtp_layers}"))
    mtp_removed = [k for k, sa_, _ in removed if sa_ is not None and sa_.mtp]
    if b.mtp_layers and mtp_removed:
        out.append(Finding("mtp-modules-dropped", "error",
                           f"{len(mtp_removed)} MTP module(s) of A are missing from B (e.g. {mtp_removed[0][0]})",
                           hint="re-export B with the complete MTP layer"))
    if a.family != b.family:
        out.append(Finding("family-differs", "warning", f"A matches family {a.family}, B {b.family}"))
    return out


def render_text(d: CheckpointDiff, limit: int = 20) -> str:
    """Human-readable diff."""
    def size(n: int) -> str:
        return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n:,} B"

    lines = [f"A: {d.a.ref}  [{d.a.family or 'unknown family'}, {d.a.label or 'unquantized'}]",
             f"B: {d.b.ref}  [{d.b.family or 'unknown family'}, {d.b.label or 'unquantized'}]",
             f"size: {size(d.a.bytes)} -> {size(d.b.bytes)} ({d.bytes_delta / d.a.bytes:+.1%})" if d.a.bytes else
             f"size: {size(d.a.bytes)} -> {size(d.b.bytes)}",
             f"tensors: {d.a.tensors:,} -> {d.b.tensors:,}; MTP layers: {d.a.mtp_layers} -> {d.b.mtp_layers} "
             f"({size(d.a.mtp_bytes)} -> {size(d.b.mtp_bytes)})"]
    sections = (("scheme changes", d.scheme_changes), ("only in A (disappeared)", d.removed),
                ("only in B (appeared)", d.added))
    for title, items in sections:
        lines.append(f"\n{title}: {len(items)} module pattern(s)")
        for c in items[:limit]:
            where = f" layers {compact_ranges(c.layers)}" if c.layers else ""
            tag = " [MTP]" if c.mtp else ""
            lines.append(f"  {c.component:<14} {c.module}{where}{tag}: {c.before or '-'} -> {c.after or '-'}"
                         f" ({size(c.bytes_a)} -> {size(c.bytes_b)})")
        if len(items) > limit:
            lines.append(f"  ... {len(items) - limit} more (--format json lists all)")
    lines.append(f"\nexclude-list entries: {len(d.excludes_only_a)} only in A, {len(d.excludes_only_b)} only in B")
    for e in d.excludes_only_a[:limit]:
        lines.append(f"  - {e}")
    for e in d.excludes_only_b[:limit]:
        lines.append(f"  + {e}")
    if d.findings:
        lines.append("\nfindings:")
        for f in d.findings:
            lines.append(f"  {f.severity}: {f.code}: {f.message}" + (f" (fix: {f.hint})" if f.hint else ""))
    return "\n".join(lines)


def load_and_diff(ref_a: str, ref_b: str, *, rules_dirs: Mapping[str, Any] | tuple = (),
                  progress: bool = False) -> CheckpointDiff:
    from ckptinspect.pipeline import build_report

    ra = build_report(ref_a, rules_dirs=tuple(rules_dirs), progress=progress)
    rb = build_report(ref_b, rules_dirs=tuple(rules_dirs), progress=progress)
    return diff_checkpoints(ra.checkpoint, rb.checkpoint, ra.mtp, rb.mtp)
