"""`probe` output: JSON (probe/probe.schema.json) and terminal text.

The probe's records and their text layout live in ckptinspect/probe/result.py, which the probe's
owners are reworking; the CLI goes through this module so that moving that layout here changes no caller.
"""

from __future__ import annotations

import json
from typing import Any

from ckptinspect.render.terminal import wrap_text


def render_probe(result: Any, fmt: str, *, width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps(result.to_json(), indent=2)
    from ckptinspect.probe.result import render_text

    return wrap_text(render_text(result), width)


def write_probe_plot(result: Any, path: str) -> None:
    """`probe --plot`: acceptance per depth and projected speedup as a PNG (matplotlib, optional)."""
    from ckptinspect.probe.plot import write_plot

    write_plot(result, path)
