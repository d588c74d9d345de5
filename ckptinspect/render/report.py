"""`report` output in each format: the one entry point the CLI (and scripts/gen_docs.py) call."""

from __future__ import annotations

from typing import Any

FORMATS = ("text", "json", "markdown")


def render_report(report: Any, fmt: str, *, width: int | None = None, colour: bool = False) -> str:
    """``report`` (a pipeline.Report) as ``fmt``, ending in a newline."""
    if fmt == "json":
        from ckptinspect.render.json_out import dumps, report_to_json

        return dumps(report_to_json(report)) + "\n"
    from ckptinspect.escape import escaped
    from ckptinspect.render.text import render_markdown, render_text

    report = escaped(report)  # names and values from the checkpoint reach a terminal: no raw controls
    if fmt == "markdown":
        return render_markdown(report)
    return render_text(report, width=width, colour=colour)
