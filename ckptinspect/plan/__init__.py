"""Deployment plan: GPU fit, TP/EP that load, SGLang / vLLM launch commands with reasons.

    plan = make_plan(checkpoint, mtp, gpu="rtx-pro-6000", gpus=8)
    plan.to_json()               # the `plan --format json` contract (plan.schema.json)
    render_plan_text(plan)       # terminal text; render_plan_markdown(plan) for reports
"""

from __future__ import annotations

from ckptinspect.plan.gpus import GpuSpec, find_gpu, load_gpus
from ckptinspect.plan.plan import Plan, make_plan
from ckptinspect.plan.render import render_plan_markdown, render_plan_text

__all__ = ["GpuSpec", "Plan", "find_gpu", "load_gpus", "make_plan", "render_plan_markdown", "render_plan_text"]
