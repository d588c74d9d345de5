"""`plan` output in each format: JSON (plan_json.py, the plan.schema.json contract), terminal text and
Markdown (plan_text.py). The one entry point the CLI and the report renderers call."""

from __future__ import annotations

import json
from typing import Any

from ckptinspect.escape import escaped
from ckptinspect.render.plan_json import plan_json
from ckptinspect.render.plan_text import render_plan_markdown, render_plan_text
from ckptinspect.render.terminal import wrap_text

FORMATS = ("text", "json", "markdown")

__all__ = ["FORMATS", "plan_json", "render_plan"]


def render_plan(plan: Any, fmt: str, *, width: int | None = None) -> str:
    """The plan as ``fmt``; text is wrapped to ``width`` (shell command lines stay whole)."""
    if type(plan).__name__ == "LlamaCppPlan":  # a GGUF checkpoint's llama-server plan
        from ckptinspect.render.llamacpp_plan_out import render_llamacpp_plan

        return render_llamacpp_plan(plan, fmt, width=width)
    if fmt == "json":
        return json.dumps(plan_json(plan), indent=2) + "\n"
    plan = escaped(plan)  # the model path and notes quote the checkpoint: no raw controls on a terminal
    if fmt == "markdown":
        return render_plan_markdown(plan)
    return wrap_text(render_plan_text(plan), width)
