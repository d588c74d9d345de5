"""Plan records: a plan that runs (Plan) and one that cannot be made (PlanFailure); plain data, rendered by
ckptinspect/render/plan_out.py."""

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
