"""GPU catalog (rules/gpus.yaml) -> GpuSpec, looked up by name or alias."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import PlanError
from ckptinspect.plan.rules import gpu_rules


@dataclass(frozen=True)
class GpuSpec:
    name: str
    aliases: tuple[str, ...]
    vendor: str
    arch: str  # engine rule key: sm90, sm100, sm120, gfx942, ...
    compute_capability: str
    memory_gib: float
    bandwidth_tbps: float
    tflops_bf16: float | None
    tflops_fp8: float | None
    tflops_fp4: float | None
    interconnect: str  # nvlink | pcie | infinity_fabric | other
    interconnect_detail: str
    source: str


def _spec(entry: Mapping[str, Any]) -> GpuSpec:
    tf = entry["tflops"]
    return GpuSpec(
        name=entry["name"], aliases=tuple(entry["aliases"]), vendor=entry["vendor"], arch=entry["arch"],
        compute_capability=str(entry["compute_capability"]), memory_gib=float(entry["memory_gib"]),
        bandwidth_tbps=float(entry["bandwidth_tbps"]), tflops_bf16=tf["bf16"], tflops_fp8=tf["fp8"],
        tflops_fp4=tf["fp4"], interconnect=entry["interconnect"],
        interconnect_detail=entry.get("interconnect_detail", ""), source=entry["source"],
    )


def load_gpus() -> tuple[GpuSpec, ...]:
    return tuple(_spec(e) for e in gpu_rules()["gpus"])


def _key(text: str) -> str:
    # "RTX PRO 6000", "rtx_pro_6000" and "rtx-pro-6000" all name the same card.
    return re.sub(r"[\s_]+", "-", text.strip().lower())


# nvidia-smi / rocm-smi spell a card with its vendor, its product line and its packaging
# ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
# "NVIDIA GeForce RTX 5090", "NVIDIA B300 SXM6 AC", "AMD Instinct MI300X"). These words never tell two
# catalog cards apart, so they are dropped; words that do ("PCIe", "NVL", "Max-Q") are kept, so
# "H100 NVL" stays unknown rather than becoming another card.
_VENDOR_PREFIXES = ("nvidia-", "amd-instinct-", "amd-", "geforce-")
_PACKAGING = {"hbm3", "hbm3e", "server", "workstation", "edition", "sxm4", "sxm5", "sxm6", "ac", "blackwell"}


def name_keys(name: str) -> list[str]:
    """Normalised spellings of ``name`` to look up, most literal first: as typed, without the vendor
    prefix, then without packaging words too."""
    key = _key(name).replace("/", "-")
    keys = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            keys.append(key)
    tokens = re.split(r"-", key)
    stripped = "-".join(t for t in tokens if t not in _PACKAGING)
    if stripped and stripped not in keys:
        keys.append(stripped)
    return keys


def find_gpu(name: str) -> GpuSpec:
    """The catalog entry whose name or alias equals ``name`` (case, space and '_' insensitive), also as
    nvidia-smi prints it (``name_keys``)."""
    gpus = load_gpus()
    for wanted in name_keys(name):
        for gpu in gpus:
            if wanted == _key(gpu.name) or wanted in (_key(a) for a in gpu.aliases):
                return gpu
    known = ", ".join(f"{g.name} ({'/'.join(g.aliases[:2])})" if g.aliases else g.name for g in gpus)
    raise PlanError(f"unknown GPU {name!r}; known GPUs: {known}", hint="pass --gpu with one of these names or aliases")
