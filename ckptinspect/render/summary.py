"""Aggregations shared by the JSON, text and markdown renderers (computed once per report)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from ckptinspect.records import SCHEMES, Checkpoint, Inventory


@dataclass(frozen=True)
class Bucket:
    tensors: int = 0
    params: int = 0
    bytes: int = 0

    def add(self, tensors: int, params: int, nbytes: int) -> "Bucket":
        return Bucket(self.tensors + tensors, self.params + params, self.bytes + nbytes)


def bucket_json(bucket: Bucket) -> dict[str, int]:
    return {"tensors": bucket.tensors, "params": bucket.params, "bytes": bucket.bytes}


def by_scheme(inventory: Inventory) -> dict[str, Bucket]:
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for g in inventory.groups:
        a = acc[g.scheme]
        a[0] += g.tensors
        a[1] += g.params
        a[2] += g.bytes
    order = {s: i for i, s in enumerate(SCHEMES)}
    return {k: Bucket(*v) for k, v in sorted(acc.items(), key=lambda kv: order.get(kv[0], 99))}


def by_component(inventory: Inventory) -> dict[str, dict]:
    """component -> {tensors, params, bytes, schemes: {scheme: tensors}} (MTP groups under "mtp")."""
    acc: dict[str, dict] = {}
    for g in inventory.groups:
        name = "mtp" if g.mtp_layer is not None else g.component
        if g.component == "attention" and g.mtp_layer is None and g.kind:
            name = f"attention ({g.kind})"
        if g.component == "routed_expert" and g.mtp_layer is None:
            name = "routed_expert"
        entry = acc.setdefault(name, {"tensors": 0, "params": 0, "bytes": 0, "schemes": defaultdict(int)})
        entry["tensors"] += g.tensors
        entry["params"] += g.params
        entry["bytes"] += g.bytes
        entry["schemes"][g.scheme] += g.tensors
    for entry in acc.values():
        entry["schemes"] = dict(entry["schemes"])
    return acc


def experts_present(checkpoint: Checkpoint) -> Mapping[str, int | None]:
    """Routed experts found per MoE layer (min / max over layers), None for dense models."""
    counts = checkpoint.inventory.experts_per_layer()
    if not counts:
        return {"present_min": None, "present_max": None, "moe_layers": 0}
    return {"present_min": min(counts.values()), "present_max": max(counts.values()), "moe_layers": len(counts)}


def stored_label(shares: dict[str, int], total: int, *, top: int = 2) -> str:
    """What is stored, by share of bytes, largest first: ``nvfp4 92.6%, fp8_block 5.1%`` (``shares``:
    scheme -> bytes). Shown beside the declared quantization, which can name another scheme (a config
    that says fp8 over weights that are mostly NVFP4)."""
    ranked = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return ", ".join(f"{k} {100 * v / max(1, total):.1f}%" for k, v in ranked if v) or "none"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"


def human_count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)
