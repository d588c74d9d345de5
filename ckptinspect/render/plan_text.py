"""A plan (or a plan that cannot be made) as terminal text and as Markdown (the `plan` command and the
report's plan section)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only (see plan_json.py)
    from ckptinspect.plan.result import Plan, PlanFailure
    from ckptinspect.plan.solver import ContextSolution


def _summary(plan: Plan) -> list[str]:
    c, g = plan.chosen, plan.gib
    kv = c.kv
    mtp = ", ".join(f"{k} {v / g:.2f} GiB" for k, v in plan.mtp_dtypes.items()) or "none"
    lines = [
        f"{plan.model} on {plan.gpus}x {plan.gpu.name} ({plan.gpu.arch}, {plan.gpu.memory_gib:g} GiB, "
        f"{plan.gpu.interconnect}), goal {plan.goal}, context {plan.context}",
        f"quantization: {plan.quant_label or plan.quant_kind} ({plan.quant_kind}); attention: {plan.attention_kind}"
        f"{'; MoE' if plan.moe else ''}",
        f"parallel: TP {c.memory.tp} EP {c.memory.ep} -- {plan.parallel_reason}",
        f"weights per GPU: {c.memory.main_bytes_per_rank / g:.2f} GiB + MTP draft {c.memory.mtp_bytes_per_rank / g:.2f} GiB"
        f" (MTP stored as: {mtp})",
        f"static pool: --mem-fraction-static {c.mem.value:g} of {plan.gpu.memory_gib:g} GiB"
        f" (SGLang rule {c.mem.formula:g}{'; ' + c.mem.cap_reason if c.mem.cap_reason else ''})",
        f"KV cache ({kv.kv_dtype}): {kv.budget_bytes / g:.2f} GiB per GPU, {kv.bytes_per_token:.0f} B/token/GPU"
        + (f", {kv.state_bytes_per_request / 2**20:.1f} MiB state per request" if kv.state_bytes_per_request else "")
        + f" -> {kv.tokens:,} tokens = {kv.tokens // kv.context} full-context requests;"
        f" max running requests {kv.max_running_requests}",
        f"smallest GPU count: {plan.min_gpus}x {plan.gpu.name}"
        + (f" ({plan.min_gpus_reason})" if plan.min_gpus_reason else ""),
    ]
    if plan.idle_reason:
        lines.insert(3, f"GPUs used: {plan.gpus_used} of {plan.gpus} -- {plan.idle_reason}")
    if plan.requested_context and plan.context != plan.requested_context:
        lines.insert(3, f"context: {plan.context} tokens (requested {plan.requested_context}; max-context solver)")
    return lines


def _solution(sol: ContextSolution | None, gib: int) -> list[str]:
    if sol is None:
        return []
    out = [f"Longest context for {sol.concurrency} concurrent request(s) (requested {sol.requested}):"]
    for s in sol.steps:
        mark = "*" if sol.chosen is s else " "
        state = f"skipped: {s.skipped}" if s.skipped else (
            f"{s.max_context} tokens" if s.max_context else f"under {sol.min_context} tokens")
        out.append(f" {mark} {s.id}: kv {s.kv_dtype}, --mem-fraction-static {s.mem.value:g}, chunked prefill "
                   f"{s.mem.chunked_prefill_size}, MTP {'on' if s.spec else 'off'}: weights "
                   f"{s.weights.total_bytes_per_rank / gib:.2f} GiB, KV budget {s.budget_bytes / gib:.2f} GiB -> {state}"
                   + (f"; risk: {s.risk}" if s.risk and not s.skipped else ""))
    if sol.chosen is None:
        out.append(f"   nothing runs: {sol.shortfall_bytes / gib:.2f} GiB per GPU short")
    return out


def _failure_lines(f: PlanFailure) -> list[str]:
    g = f.gib
    lines = [f"no plan: {f.message}", f"hint: {f.hint}"] + (["TP / EP options:"] if f.options else [])
    for o in f.options:
        state = "ok" if o.loads and o.fits else o.why_not(g)
        lines.append(f"  TP {o.memory.tp:>2} EP {o.memory.ep:>2}: weights {o.memory.main_bytes_per_rank / g:7.2f} GiB"
                     f" + MTP {o.memory.mtp_bytes_per_rank / g:5.2f} GiB per GPU -- {state}")
    return lines + _solution(f.solution, g)


def _options(plan: Plan) -> list[str]:
    g = plan.gib
    out = []
    for o in plan.options:
        state = "ok" if o.loads and o.fits else o.why_not(g)
        out.append(f"TP {o.memory.tp:>2} EP {o.memory.ep:>2}: weights {o.memory.main_bytes_per_rank / g:7.2f} GiB"
                   f" + MTP {o.memory.mtp_bytes_per_rank / g:5.2f} GiB per GPU -- {state}")
    return out


def _plan_side(a) -> str:
    """How the plan's own value for a setting relates to the engine's auto."""
    if a.plan_value is None:
        return "plan keeps auto"
    if str(a.plan_value) == a.value:
        return "plan sets the same value explicitly"
    return f"plan sets {a.plan_value}"


def render_plan_text(plan: Plan | PlanFailure) -> str:
    if not plan.ok:
        return "\n".join(["Deployment plan", "==============="] + _failure_lines(plan)) + "\n"
    lines = ["Deployment plan", "==============="] + _summary(plan) + ["", "TP / EP options:"]
    lines += ["  " + x for x in _options(plan)]
    if plan.solution:
        lines += [""] + _solution(plan.solution, plan.gib)
    for name, cmd in plan.commands.items():
        lines += ["", f"{name} {cmd.version}:", cmd.shell(), "", "Why each flag:"]
        lines += [f"  {f.flag}: {f.reason} [{f.source}]" for f in cmd.flags]
        lines += [f"  env {e.name}={e.value}: {e.reason} [{e.source}]" for e in cmd.env]
        if cmd.engine_auto:
            lines.append("What the engine's auto picks here:")
            lines += [f"  {a.flag} auto -> {a.value} ({_plan_side(a)}): {a.reason} [{a.source}]" for a in cmd.engine_auto]
        if cmd.alternatives:
            lines.append("Alternatives:")
            lines += [f"  {a.flag} {a.value}: {a.reason} [{a.source}]" for a in cmd.alternatives]
        if cmd.avoid:
            lines.append("Avoid on this GPU:")
            lines += [f"  {a.flag} {a.value}: {a.reason} [{a.source}]" for a in cmd.avoid]
        lines += [f"Caveat: {c}" for c in cmd.caveats]
    if plan.notes:
        lines += ["", "Notes:"] + [f"  [{n.severity}] {n.message} [{n.source}]" for n in plan.notes]
    return "\n".join(lines) + "\n"


def render_plan_markdown(plan: Plan | PlanFailure) -> str:
    if not plan.ok:
        lines = ["## Deployment plan", "", f"- **no plan**: {plan.message}", f"- hint: {plan.hint}"]
        lines += ["", "| TP | EP | weights GiB/GPU | MTP GiB/GPU | status |", "|---|---|---|---|---|"]
        lines += [f"| {o.memory.tp} | {o.memory.ep} | {o.memory.main_bytes_per_rank / plan.gib:.2f} | "
                  f"{o.memory.mtp_bytes_per_rank / plan.gib:.2f} | {o.why_not(plan.gib).replace('|', '/')} |"
                  for o in plan.options]
        lines += [""] + [f"- {x.strip()}" for x in _solution(plan.solution, plan.gib)] if plan.solution else []
        return "\n".join(lines) + "\n"
    lines = ["## Deployment plan", ""] + [f"- {x}" for x in _summary(plan)]
    if plan.solution:
        lines += [""] + [f"- {x.strip()}" for x in _solution(plan.solution, plan.gib)]
    lines += ["", "| TP | EP | weights GiB/GPU | MTP GiB/GPU | status |", "|---|---|---|---|---|"]
    g = plan.gib
    for o in plan.options:
        state = "ok" if o.loads and o.fits else o.why_not(g).replace("|", "/")
        lines.append(f"| {o.memory.tp} | {o.memory.ep} | {o.memory.main_bytes_per_rank / g:.2f} | "
                     f"{o.memory.mtp_bytes_per_rank / g:.2f} | {state} |")
    for name, cmd in plan.commands.items():
        lines += ["", f"### {name} {cmd.version}", "", "```sh", cmd.shell(), "```", "",
                  "| flag | value | why | source |", "|---|---|---|---|"]
        lines += [f"| `{f.flag}` | `{f.value if f.value is not None else ''}` | {f.reason} | {f.source} |"
                  for f in cmd.flags]
        lines += [f"| env `{e.name}` | `{e.value}` | {e.reason} | {e.source} |" for e in cmd.env]
        if cmd.engine_auto:
            lines += ["", "What the engine's auto picks here: " + "; ".join(
                f"`{a.flag} auto` -> `{a.value}` ({_plan_side(a)}; {a.reason}, {a.source})" for a in cmd.engine_auto)]
        if cmd.alternatives:
            lines += ["", "Alternatives: " + "; ".join(f"`{a.flag} {a.value}` ({a.reason}, {a.source})"
                                                     for a in cmd.alternatives)]
        if cmd.avoid:
            lines += ["", "Avoid on this GPU: " + "; ".join(f"`{a.flag} {a.value}` ({a.reason}, {a.source})"
                                                          for a in cmd.avoid)]
        lines += [f"\n> {c}" for c in cmd.caveats]
    if plan.notes:
        lines += ["", "Notes:"] + [f"- **{n.severity}**: {n.message} ({n.source})" for n in plan.notes]
    return "\n".join(lines) + "\n"
