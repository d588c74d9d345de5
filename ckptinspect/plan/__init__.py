"""Deployment plan: GPU fit, TP/EP that load, SGLang / vLLM launch commands with reasons.

    plan = make_plan(checkpoint, mtp, gpu="rtx-pro-6000", gpus=8)   # PlanError when nothing runs
    result = plan_or_failure(checkpoint, mtp, gpu="h200", gpus=3)   # Plan or PlanFailure (report section)
    render_plan(plan, "json")    # ckptinspect/render/plan_out.py: the `plan --format json` contract
                                 # (plan.schema.json), text and markdown; plans are plain records
    weights_per_gpu(checkpoint, tp=4, ep=4)   # the one per-GPU weight memory model (plan/memory.py)
"""

from __future__ import annotations

from ckptinspect.plan.gpus import GpuSpec, find_gpu, load_gpus
from ckptinspect.plan.memory import Split, split_problem, weight_memory, weights_per_gpu
from ckptinspect.plan.plan import make_plan, plan_or_failure
from ckptinspect.plan.result import Plan, PlanFailure

__all__ = ["GpuSpec", "Plan", "PlanFailure", "Split", "find_gpu", "load_gpus", "make_plan", "plan_or_failure",
           "split_problem", "weight_memory", "weights_per_gpu"]
