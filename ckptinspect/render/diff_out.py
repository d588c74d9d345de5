"""`diff` output: the JSON document (versioned like the report's) and terminal text."""

from __future__ import annotations

import json
from typing import Any, Iterable

from ckptinspect.diff import CheckpointDiff, PatternChange, Side
from ckptinspect.render import terminal
from ckptinspect.escape import escaped
from ckptinspect.render.findings import finding_json

SCHEMA_VERSION = 1  # keys of schema_version 1 are stable; a removed or renamed key bumps it


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


def _change_json(c: PatternChange) -> dict[str, Any]:
    return {"component": c.component, "module": c.module, "layers": compact_ranges(c.layers),
            "before": c.before, "after": c.after, "bytes_a": c.bytes_a, "bytes_b": c.bytes_b, "mtp": c.mtp}


def _side_json(s: Side) -> dict[str, Any]:
    return {"ref": s.ref, "family": s.family, "declared_quant": s.label, "tensors": s.tensors,
            "params": s.params, "bytes": s.bytes,
            "mtp": {"layers": s.mtp_layers, "tensors": s.mtp_tensors, "bytes": s.mtp_bytes},
            "exclude_entries": len(s.excludes)}


def diff_json(d: CheckpointDiff) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "a": _side_json(d.a), "b": _side_json(d.b),
        "size": {"bytes_a": d.a.bytes, "bytes_b": d.b.bytes, "bytes_delta": d.bytes_delta,
                 "ratio": round(d.b.bytes / d.a.bytes, 6) if d.a.bytes else None},
        "scheme_changes": [_change_json(c) for c in d.scheme_changes],
        "removed": [_change_json(c) for c in d.removed],
        "added": [_change_json(c) for c in d.added],
        "excludes": {"only_a": list(d.excludes_only_a), "only_b": list(d.excludes_only_b)},
        "findings": [finding_json(f) for f in d.findings],
    }


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n:,} B"


def diff_text(d: CheckpointDiff, *, limit: int = 20, width: int | None = None, colour: bool = False) -> str:
    """Human-readable diff, wrapped to ``width`` (None: full width)."""
    size = _size
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
            lines.append(f"  {terminal.severity(f.severity, colour)}: {f.code}"
                         + (f" [{f.engine}]" if f.engine else "") + f": {f.message}"
                         + (f" (fix: {f.hint})" if f.hint else ""))
    return terminal.wrap_text("\n".join(lines), width)


def render_diff(d: CheckpointDiff, fmt: str, *, limit: int = 20, width: int | None = None,
                colour: bool = False) -> str:
    if fmt == "json":
        return json.dumps(diff_json(d), indent=2)
    return diff_text(escaped(d), limit=limit, width=width, colour=colour)
