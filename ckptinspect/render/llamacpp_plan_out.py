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


def _size(n: int) -> str:
    return f"{n / 1024 ** 3:.2f} GiB" if n >= 1024 ** 3 else f"{n / 1024 ** 2:.2f} MiB"


def _text(plan: Any, markdown: bool) -> str:
    # one flag per line with backslash continuations: wrap_text leaves such lines whole, so it pastes
    pairs = [f.flag if f.value is None else f"{f.flag} {shlex.quote(f.value)}" for f in plan.flags]
    cmd = " \\\n  ".join([plan.command[0], *pairs])
    head = (f"llama.cpp {plan.engine_version} on {plan.gpus} x {plan.gpu}: {plan.gpu_layers}/{plan.total_layers} "
            f"blocks on GPU, context {plan.context:,}, MTP {plan.mtp}"
            f"{' (on)' if plan.mtp_on else ' (off)'}")
    mem = (f"weights {_size(plan.weight_bytes)} ({_size(plan.gpu_weight_bytes)} on GPU), "
           f"KV {_size(plan.kv_bytes)}, usable GPU memory {_size(plan.gpu_bytes)}")
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
