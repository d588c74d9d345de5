"""`plan` output in each format: JSON (plan.schema.json), terminal text, markdown.

The plan's text and markdown layout is still built by ckptinspect/plan/render.py and its JSON by the
plan records, which the planner's owners are reworking; this module is the one place the CLI and the
report renderers go through, so moving those builders here later changes no caller.
"""

from __future__ import annotations

import json
from typing import Any

from ckptinspect.render.terminal import wrap_text

FORMATS = ("text", "json", "markdown")


def plan_json(plan: Any) -> dict[str, Any]:
    return plan.to_json()


def render_plan(plan: Any, fmt: str, *, width: int | None = None) -> str:
    """The plan as ``fmt``; text is wrapped to ``width`` (shell command lines stay whole)."""
    from ckptinspect.plan import render_plan_markdown, render_plan_text

    if fmt == "json":
        return json.dumps(plan_json(plan), indent=2) + "\n"
    if fmt == "markdown":
        return render_plan_markdown(plan)
    return wrap_text(render_plan_text(plan), width)
