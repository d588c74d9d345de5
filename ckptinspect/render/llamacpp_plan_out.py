"""`plan` output for a GGUF checkpoint (plan/llamacpp.py LlamaCppPlan): JSON, text, Markdown."""

from __future__ import annotations

import json
import shlex
from typing import Any

from ckptinspect.render.terminal import wrap_text


def llamacpp_plan_json(plan: Any) -> dict[str, Any]:
    return {
        "format": "gguf", "engine": "llamacpp", "engine_version": plan.engine_version, "status": "ok",
        "gpu": plan.gpu, "gpus": plan.gpus, "context": plan.context,
        "gpu_layers": plan.gpu_layers, "total_layers": plan.total_layers,
        "mtp": {"verdict": plan.mtp, "enabled": plan.mtp_on},
        "memory": {"weight_bytes": plan.weight_bytes, "gpu_weight_bytes": plan.gpu_weight_bytes,
                   "kv_bytes": plan.kv_bytes, "gpu_bytes": plan.gpu_bytes},
        "command": list(plan.command),
        "flags": [{"flag": f.flag, "value": f.value, "reason": f.reason, "source": f.source} for f in plan.flags],
        "notes": list(plan.notes),
    }


def _text(plan: Any, markdown: bool) -> str:
    gib = 1024 ** 3
    cmd = " ".join(shlex.quote(x) for x in plan.command)
    head = (f"llama.cpp {plan.engine_version} on {plan.gpus} x {plan.gpu}: {plan.gpu_layers}/{plan.total_layers} "
            f"blocks on GPU, context {plan.context:,}, MTP {plan.mtp}"
            f"{' (on)' if plan.mtp_on else ' (off)'}")
    mem = (f"weights {plan.weight_bytes / gib:.2f} GiB ({plan.gpu_weight_bytes / gib:.2f} GiB on GPU), "
           f"KV {plan.kv_bytes / gib:.2f} GiB, usable GPU memory {plan.gpu_bytes / gib:.2f} GiB")
    fence = ["```"] if markdown else []
    lines = [f"# {head}" if markdown else head, "", mem, "", *fence, cmd, *fence, ""]
    lines.append("| flag | value | why |\n|---|---|---|" if markdown else "flag / value / why")
    for f in plan.flags:
        lines.append(f"| `{f.flag}` | `{f.value}` | {f.reason} |" if markdown else f"  {f.flag} {f.value or ''}: {f.reason}")
    lines.extend(f"- {note}" if markdown else f"note: {note}" for note in plan.notes)
    return "\n".join(lines) + "\n"


def render_llamacpp_plan(plan: Any, fmt: str, *, width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps(llamacpp_plan_json(plan), indent=2) + "\n"
    if fmt == "markdown":
        return _text(plan, True)
    return wrap_text(_text(plan, False), width)
