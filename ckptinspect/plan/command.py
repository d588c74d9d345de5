"""A launch command as data: flags with a one-line reason and a source each, rendered as shell."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ckptinspect.plan.backends import Alternative, Avoid, Choice, EngineAuto


@dataclass(frozen=True)
class FlagLine:
    flag: str
    value: str | None  # None for boolean flags
    reason: str
    source: str

    def args(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


@dataclass(frozen=True)
class EnvLine:
    name: str
    value: str
    reason: str
    source: str


@dataclass(frozen=True)
class Command:
    engine: str
    version: str
    launcher: tuple[str, ...]
    positional: tuple[str, ...]
    flags: tuple[FlagLine, ...]
    env: tuple[EnvLine, ...] = ()
    avoid: tuple[Avoid, ...] = ()
    caveats: tuple[str, ...] = ()
    engine_auto: tuple[EngineAuto, ...] = ()  # what the engine's own auto resolves each setting to here
    alternatives: tuple[Alternative, ...] = ()  # other values that run here, with the evidence to switch

    def args(self) -> list[str]:
        """Arguments after the launcher, as the engine's argument parser receives them."""
        out = list(self.positional)
        for f in self.flags:
            out.extend(f.args())
        return out

    def shell(self) -> str:
        """Copy-pasteable shell: env assignments, launcher, one flag per continued line."""
        head = " ".join([*(f"{e.name}={shlex.quote(e.value)}" for e in self.env), *self.launcher,
                         *(shlex.quote(p) for p in self.positional)])
        lines = [head] + ["  " + " ".join(shlex.quote(a) for a in f.args()) for f in self.flags]
        return " \\\n".join(lines)


@dataclass(frozen=True)
class LaunchInputs:
    """Everything a command writer needs, decided by plan.py."""

    model_path: str
    tp: int
    ep: int
    context: int
    goal: str
    mem_fraction: float
    mem_fraction_reason: str
    mem_fraction_source: str
    max_running_requests: int
    running_reason: str
    running_source: str
    choices: tuple[Choice, ...]
    avoid: tuple[Avoid, ...]
    parsers: Any  # rule entry or None
    spec_enabled: bool
    spec: dict = field(default_factory=dict)  # engine-specific speculative values
    spec_reason: str = ""
    trust_remote_code: bool = False
    draft_flags: tuple[FlagLine, ...] = ()  # draft-side flags (e.g. --speculative-moe-runner-backend)
    caveats: tuple[str, ...] = ()  # plan-level caveats for this command (e.g. from the max-context solver)
    revision: str | None = None  # --revision for a Hub repo pinned by the user or by a snapshot's commit


def choice_lines(choices: tuple[Choice, ...]) -> list[FlagLine]:
    out = []
    for c in choices:
        if c.value is None or c.value is False:
            continue
        out.append(FlagLine(c.flag, None if c.value is True else str(c.value), c.reason, c.source))
    return out
