"""A plan (or a plan that cannot be made) as the `plan --format json` document (plan/plan.schema.json).

The plan records (ckptinspect/plan/result.py and the records they hold) are plain data; this module is
the one place their JSON layout is written. Byte amounts become GiB with the plan's own ``gib``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the report's JSON renderer must not load the planner to render no plan
    from ckptinspect.plan.backends import Avoid
    from ckptinspect.plan.command import Command, FlagLine
    from ckptinspect.plan.fit import CheckResult
    from ckptinspect.plan.gpus import GpuSpec
    from ckptinspect.plan.kvcache import KvCapacity
    from ckptinspect.plan.memory import WeightMemory
    from ckptinspect.plan.options import Option
    from ckptinspect.plan.result import Note, Plan, PlanFailure
    from ckptinspect.plan.solver import ContextSolution, SolverStep


def plan_json(plan: Plan | PlanFailure) -> dict[str, Any]:
    """The JSON document of ``plan``: status ok with commands, or status failed with the reason."""
    if not plan.ok:
        return _failure_json(plan)
    g, c = plan.gib, plan.chosen
    return {
        "schema_version": 1, "status": "ok",
        "model": plan.model, "gpu": _gpu_json(plan.gpu), "gpus": plan.gpus, "context": plan.context,
        "requested_context": plan.requested_context or plan.context,
        "gpus_used": plan.gpus_used or plan.gpus, "idle_reason": plan.idle_reason or None,
        "goal": plan.goal, "engines": list(plan.engines),
        "quantization": {"kind": plan.quant_kind, "label": plan.quant_label},
        "attention_kind": plan.attention_kind, "moe": plan.moe,
        "parallel": {"tp": c.memory.tp, "ep": c.memory.ep, "reason": plan.parallel_reason},
        "memory": {
            **_memory_json(c.memory, g),
            "mtp_dtypes_gib": {k: round(v / g, 3) for k, v in plan.mtp_dtypes.items()},
            "gpu_memory_gib": plan.gpu.memory_gib,
            "mem_fraction_static": c.mem.value, "mem_fraction_formula": c.mem.formula,
            "mem_fraction_cap": c.mem.cap_reason, "reserved_mib": round(c.mem.reserved_mib),
            "static_pool_gib_per_gpu": round(plan.gpu.memory_gib * c.mem.value, 2),
            "by_placement_gib": {k: round(v / g, 3) for k, v in c.memory.by_placement.items()},
        },
        "kv_cache": _kv_json(c.kv, g),
        "checks": [_check_json(x) for x in c.checks],
        "options": [_option_json(o, g) for o in plan.options],
        "min_gpus": {"count": plan.min_gpus, "why_smaller_fails": plan.min_gpus_reason or None},
        "max_context": _solution_json(plan.solution, g) if plan.solution else None,
        "mtp": dict(plan.mtp_verdicts),
        "speculative": dict(plan.speculative),
        "commands": {k: _command_json(v) for k, v in plan.commands.items()},
        "notes": [_note_json(n) for n in plan.notes],
    }


def _failure_json(f: PlanFailure) -> dict[str, Any]:
    g = f.gib
    return {"schema_version": 1, "status": "failed", "model": f.model, "gpu": _gpu_json(f.gpu),
            "gpus": f.gpus, "context": f.context, "reason": f.reason, "hint": f.hint,
            "options": [_option_json(o, g) for o in f.options],
            "max_context": _solution_json(f.solution, g) if f.solution else None}


def _gpu_json(gpu: GpuSpec) -> dict[str, Any]:
    return {
        "name": gpu.name, "arch": gpu.arch, "compute_capability": gpu.compute_capability,
        "memory_gib": gpu.memory_gib, "bandwidth_tbps": gpu.bandwidth_tbps,
        "tflops": {"bf16": gpu.tflops_bf16, "fp8": gpu.tflops_fp8, "fp4": gpu.tflops_fp4},
        "interconnect": gpu.interconnect, "source": gpu.source,
    }


def _memory_json(m: WeightMemory, gib: int) -> dict[str, Any]:
    return {
        "tp": m.tp, "ep": m.ep,
        "weights_gib_per_gpu": round(m.main_bytes_per_rank / gib, 2),
        "mtp_gib_per_gpu": round(m.mtp_bytes_per_rank / gib, 2),
        "replicated_gib_per_gpu": round(m.replicated_bytes_per_rank / gib, 2),
    }


def _kv_json(kv: KvCapacity, gib: int) -> dict[str, Any]:
    return {
        "kv_cache_dtype": kv.kv_dtype, "budget_gib_per_gpu": round(kv.budget_bytes / gib, 2),
        "bytes_per_token_per_gpu": round(kv.bytes_per_token, 1),
        "state_mib_per_request": round(kv.state_bytes_per_request / 2**20, 2),
        "context": kv.context, "tokens": kv.tokens,
        "full_context_requests": kv.tokens // kv.context if kv.context else 0,
        "max_running_requests": kv.max_running_requests, "kv_model": kv.model,
    }


def _check_json(c: CheckResult) -> dict[str, Any]:
    return {"id": c.id, "ok": c.ok, "severity": c.severity, "message": c.message, "fix": c.fix, "source": c.source}


def _option_json(o: Option, gib: int) -> dict[str, Any]:
    return {**_memory_json(o.memory, gib), "loads": o.loads, "fits": o.fits,
            "failed_checks": [_check_json(c) for c in o.checks if c.blocks],
            "kv_tokens": o.kv.tokens, "miss_gib": round(o.kv.miss_bytes / gib, 2)}


def _step_json(s: SolverStep, gib: int) -> dict[str, Any]:
    return {"id": s.id, "risk": s.risk or None, "source": s.source, "kv_cache_dtype": s.kv_dtype,
            "mem_fraction_static": s.mem.value, "chunked_prefill_size": s.mem.chunked_prefill_size,
            "speculative": s.spec, "weights_gib_per_gpu": round(s.weights.total_bytes_per_rank / gib, 2),
            "kv_budget_gib_per_gpu": round(s.budget_bytes / gib, 2), "max_context": s.max_context,
            "skipped": s.skipped or None, "last_resort": s.last_resort}


def _solution_json(sol: ContextSolution, gib: int) -> dict[str, Any]:
    return {"concurrency": sol.concurrency, "requested_context": sol.requested,
            "min_context": sol.min_context, "chosen": sol.chosen.id if sol.chosen else None,
            "max_context": sol.chosen.max_context if sol.chosen else 0,
            "shortfall_gib_per_gpu": None if sol.chosen else round(sol.shortfall_bytes / gib, 2),
            "steps": [_step_json(s, gib) for s in sol.steps]}


def _flag_json(f: FlagLine) -> dict[str, Any]:
    return {"flag": f.flag, "value": f.value, "reason": f.reason, "source": f.source}


def _avoid_json(a: Avoid) -> dict[str, Any]:
    return {"flag": a.flag, "value": a.value, "reason": a.reason, "source": a.source}


def _command_json(cmd: Command) -> dict[str, Any]:
    return {
        "engine": cmd.engine, "version": cmd.version, "shell": cmd.shell(),
        "argv": [*cmd.launcher, *cmd.args()],
        "env": [{"name": e.name, "value": e.value, "reason": e.reason, "source": e.source} for e in cmd.env],
        "flags": [_flag_json(f) for f in cmd.flags],
        "avoid": [_avoid_json(a) for a in cmd.avoid],
        "engine_auto": [{"flag": a.flag, "value": a.value, "plan_value": a.plan_value, "reason": a.reason,
                         "source": a.source} for a in cmd.engine_auto],
        "alternatives": [_avoid_json(a) for a in cmd.alternatives],
        "caveats": list(cmd.caveats),
    }


def _note_json(n: Note) -> dict[str, Any]:
    return {"severity": n.severity, "message": n.message, "source": n.source}
