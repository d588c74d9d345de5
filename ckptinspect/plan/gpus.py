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


def find_gpu(name: str) -> GpuSpec:
    """The catalog entry whose name or alias equals ``name`` (case, space and '_' insensitive)."""
    wanted = _key(name)
    gpus = load_gpus()
    for gpu in gpus:
        if wanted == _key(gpu.name) or wanted in (_key(a) for a in gpu.aliases):
            return gpu
    known = ", ".join(f"{g.name} ({'/'.join(g.aliases[:2])})" if g.aliases else g.name for g in gpus)
    raise PlanError(f"unknown GPU {name!r}; known GPUs: {known}", hint="pass --gpu with one of these names or aliases")
