"""Plan records: a plan that runs (Plan) and one that cannot be made (PlanFailure), with their JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.plan.command import Command
from ckptinspect.plan.gpus import GpuSpec
from ckptinspect.plan.options import Option
from ckptinspect.plan.solver import ContextSolution


@dataclass(frozen=True)
class Note:
    severity: str
    message: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "message": self.message, "source": self.source}


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: GpuSpec
    gpus: int  # GPUs the user has
    context: int  # context the commands use (reduced by the solver when needed)
    goal: str
    engines: tuple[str, ...]
    quant_kind: str
    quant_label: str | None
    attention_kind: str
    moe: bool
    chosen: Option
    parallel_reason: str
    options: tuple[Option, ...]
    min_gpus: int | None
    min_gpus_reason: str
    mtp_dtypes: Mapping[str, int]
    mtp_verdicts: Mapping[str, Any]
    speculative: Mapping[str, Any]
    commands: Mapping[str, Command]
    notes: tuple[Note, ...]
    gib: int
    requested_context: int = 0
    gpus_used: int = 0  # GPUs the plan runs on (<= gpus); the rest stay idle for idle_reason
    idle_reason: str = ""
    solution: ContextSolution | None = None  # max-context solver result when it ran

    ok = True

    def to_json(self) -> dict[str, Any]:
        g, c = self.gib, self.chosen
        return {
            "schema_version": 1, "status": "ok",
            "model": self.model, "gpu": self.gpu.to_json(), "gpus": self.gpus, "context": self.context,
            "requested_context": self.requested_context or self.context,
            "gpus_used": self.gpus_used or self.gpus, "idle_reason": self.idle_reason or None,
            "goal": self.goal, "engines": list(self.engines),
            "quantization": {"kind": self.quant_kind, "label": self.quant_label},
            "attention_kind": self.attention_kind, "moe": self.moe,
            "parallel": {"tp": c.memory.tp, "ep": c.memory.ep, "reason": self.parallel_reason},
            "memory": {
                **c.memory.to_json(g),
                "mtp_dtypes_gib": {k: round(v / g, 3) for k, v in self.mtp_dtypes.items()},
                "gpu_memory_gib": self.gpu.memory_gib,
                "mem_fraction_static": c.mem.value, "mem_fraction_formula": c.mem.formula,
                "mem_fraction_cap": c.mem.cap_reason, "reserved_mib": round(c.mem.reserved_mib),
                "static_pool_gib_per_gpu": round(self.gpu.memory_gib * c.mem.value, 2),
                "by_placement_gib": {k: round(v / g, 3) for k, v in c.memory.by_placement.items()},
            },
            "kv_cache": c.kv.to_json(g),
            "checks": [x.to_json() for x in c.checks],
            "options": [o.to_json(g) for o in self.options],
            "min_gpus": {"count": self.min_gpus, "why_smaller_fails": self.min_gpus_reason or None},
            "max_context": self.solution.to_json(g) if self.solution else None,
            "mtp": dict(self.mtp_verdicts),
            "speculative": dict(self.speculative),
            "commands": {k: v.to_json() for k, v in self.commands.items()},
            "notes": [n.to_json() for n in self.notes],
        }


@dataclass(frozen=True)
class PlanFailure:
    """No launch command: why, with the closest option's numbers (a report section, not an exit)."""

    model: str
    gpu: GpuSpec
    gpus: int
    context: int
    reason: str
    hint: str
    options: tuple[Option, ...]
    solution: ContextSolution | None
    gib: int

    ok = False

    @property
    def message(self) -> str:
        return f"{self.model} does not run on {self.gpus}x {self.gpu.name}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        g = self.gib
        return {"schema_version": 1, "status": "failed", "model": self.model, "gpu": self.gpu.to_json(),
                "gpus": self.gpus, "context": self.context, "reason": self.reason, "hint": self.hint,
                "options": [o.to_json(g) for o in self.options],
                "max_context": self.solution.to_json(g) if self.solution else None}
