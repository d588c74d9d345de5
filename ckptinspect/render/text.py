"""Human tables for `report` (text and markdown share the section builders; only the table format differs)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ckptinspect.render import terminal
from ckptinspect.render.plan_out import render_plan
from ckptinspect.render.summary import (by_component, by_scheme, experts_present, human_bytes, human_count,
                                       stored_label)

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def sections(report: Any, colour: bool = False) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(title, headers, rows) for each table of the report (``colour``: ANSI-coloured verdicts)."""
    ck = report.checkpoint
    cfg, inv = ck.config, ck.inventory
    present = experts_present(ck)
    experts = "-"
    if cfg.routed_experts:
        experts = (f"{cfg.routed_experts} routed (top-{cfg.experts_per_token}), {cfg.shared_experts} shared; "
                   f"present per MoE layer {present['present_min']}..{present['present_max']} "
                   f"in {present['moe_layers']} layers")
    summary = [
        ["Checkpoint", f"{ck.ref} ({ck.kind})"],
        ["Architecture", f"{cfg.architecture} / {cfg.model_type}"
         + (f" / text {cfg.text_model_type}" if cfg.text_model_type else "")],
        ["Family rule", ck.family or ("none (GGUF: rules/engines/llamacpp.yaml)" if ck.format == "gguf"
                                       else "none (generic MTP scan)")],
        ["Layers / hidden", f"{cfg.num_hidden_layers} / {cfg.hidden_size}"],
        ["Attention", _attention(cfg)],
        ["Experts", experts],
        ["Declared quantization", ck.declared.label or "none"],
        ["Stored (share of bytes)", stored_label({k: b.bytes for k, b in by_scheme(inv).items()}, inv.totals.bytes)],
        ["Tensors / params / size", f"{inv.totals.tensors:,} / {human_count(inv.totals.params)} / "
                                    f"{human_bytes(inv.totals.bytes)}"],
        ["Shards", f"{len(inv.shards)} (headers {human_bytes(sum(s.header_length + 8 for s in inv.shards))})"],
    ]
    out = [("Summary", ["", ""], summary)]

    comp_rows = [[name, f"{c['tensors']:,}", human_count(c["params"]), human_bytes(c["bytes"]),
                  ", ".join(f"{s}:{n}" for s, n in sorted(c["schemes"].items(), key=lambda kv: -kv[1]))]
                 for name, c in sorted(by_component(inv).items(), key=lambda kv: -kv[1]["bytes"])]
    out.append(("Components", ["component", "tensors", "params", "size", "schemes (tensors)"], comp_rows))

    scheme_rows = [[s, f"{b.tensors:,}", human_count(b.params), human_bytes(b.bytes),
                    f"{100 * b.bytes / max(1, inv.totals.bytes):.1f}%"] for s, b in by_scheme(inv).items()]
    out.append(("Quantization schemes (detected from tensors)", ["scheme", "tensors", "params", "size", "share"],
                scheme_rows))

    mtp = report.mtp
    if mtp is not None:
        rows = [
            ["Declared", f"{mtp.declared_key} = {mtp.declared_layers}" if mtp.declared_key else "no config key"],
            ["Present layers", str(mtp.present_layers)],
            ["Tensors / params / size", f"{mtp.tensors:,} / {human_count(mtp.params)} / {human_bytes(mtp.bytes)}"],
            ["Schemes", ", ".join(f"{s}:{n}" for s, n in mtp.schemes.items()) or "-"],
            ["Complete", "yes" if mtp.complete else "no"],
        ]
        for layer in mtp.layers:
            experts_txt = (f", experts {layer.experts_present}/{layer.experts_expected}"
                           if layer.experts_expected else "")
            missing = f", missing {len(layer.missing)}" if layer.missing else ""
            rows.append([f"Layer {layer.k}", f"{layer.prefix} {layer.tensors} tensors{experts_txt}{missing}"])
        if any(v.verdict in ("ready", "degraded") for v in mtp.verdicts.values()):
            from ckptinspect.plan.payoff import report_line

            plan = getattr(report, "plan", None)
            gpu = getattr(plan, "gpu", None)  # a GGUF's llama.cpp plan names its card by a string
            rows.append(["Pays off?", report_line(ck, gpu if gpu is not None and not isinstance(gpu, str) else None)])
        out.append(("MTP summary", ["", ""], rows))
        ready_rows = [[engine, v.engine_version, terminal.verdict(v.verdict, colour), v.method or "-", v.draft_architecture or "-",
                       v.draft_quantization or "unquantized", v.layers_used, ", ".join(v.reasons) or "-"]
                      for engine, v in mtp.verdicts.items()]
        out.append(("MTP readiness", ["engine", "version", "verdict", "method", "draft class", "draft quant",
                                      "layers used", "because"], ready_rows))
        checks = getattr(report, "engine_checks", ())
        if checks:  # report --verify-engine: one line per engine (verify/decide.py)
            out.append(("Engine check (the engine's own dry-load decides)", ["engine", "answer"],
                        [[c.engine, c.line()] for c in checks]))
        # Only modules some engine builds unlike what is stored: the rest fit everywhere (all rows: JSON).
        misfits = [m for m in mtp.modules if not all(m.matches.values())]
        if misfits:
            engines = list(misfits[0].built)
            module_rows = [[m.module, m.declared, m.stored,
                            *[m.built[e] + ("" if m.matches[e] else " (!)") for e in engines]] for m in misfits]
            rest = len(mtp.modules) - len(misfits)
            if rest:  # a row, not the title: a title is never wrapped, and 80 columns must hold
                module_rows.append([f"(+{rest} that fit every engine: --format json)", "", "",
                                    *["" for _ in engines]])
            out.append(("MTP modules (! = built unlike stored)",
                        ["module", "declared", "stored", *[f"{e} builds" for e in engines]], module_rows))
    for draft in getattr(report, "drafts", ()):
        out.extend(_draft_sections(draft, colour))
    for cost in report.mtp_costs:
        out.append((f"MTP cost at TP={cost.tp} EP={cost.ep}", ["", ""], [
            ["MTP params / stored size", f"{human_count(cost.params)} / {human_bytes(cost.bytes)}"],
            ["Loaded by the engine", f"{human_bytes(cost.loaded_bytes)} (embedding / head shared with the target;"
                                     f" routed experts {human_bytes(cost.expert_bytes)})"],
            ["Per GPU", f"{human_bytes(cost.bytes_per_gpu)} of {human_bytes(cost.total_bytes_per_gpu)} weights "
                        f"({100 * cost.share_per_gpu:.2f}%)"],
        ]))

    findings = sorted(list(ck.findings) + (list(mtp.findings) if mtp else []),
                      key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))
    rows = [[terminal.severity(f.severity, colour), f.code + (f" [{f.engine}]" if f.engine else ""),
             f.message + (f" Fix: {f.hint}" if f.hint else "") + (f" ({f.reference})" if f.reference else "")]
            for f in findings]
    out.append(("Findings", ["severity", "code", "message"], rows or [["-", "-", "no findings"]]))
    return out


def _draft_sections(draft: Any, colour: bool) -> list[tuple[str, list[str], list[list[Any]]]]:
    """A draft subfolder the family declares (records.DraftAssessment): what was read, and each engine's verdict."""
    title = f"MTP draft subfolder {draft.subfolder}/ ({draft.family})"
    rows: list[list[Any]] = [["Status", draft.status], ["Location", draft.location]]
    mtp, ck = draft.mtp, draft.checkpoint
    if ck is not None and mtp is not None:
        rows += [
            ["Draft", f"{ck.config.architecture} (family {ck.family or 'none'})"],
            ["Declared quantization", ck.declared.label or "none"],
            ["Layers declared / present", f"{mtp.declared_layers} / {mtp.present_layers}"],
            ["Tensors / params / size", f"{mtp.tensors:,} / {human_count(mtp.params)} / {human_bytes(mtp.bytes)}"],
            ["Schemes", ", ".join(f"{s}:{n}" for s, n in mtp.schemes.items()) or "-"],
            ["Complete", "yes" if mtp.complete else "no"],
        ]
    rows.append(["Engines look there", draft.reference])
    out = [(title, ["", ""], rows)]
    if draft.verdicts:
        out.append((f"MTP draft {draft.subfolder}/ readiness",
                    ["engine", "version", "verdict", "method", "draft class", "draft quant", "because"],
                    [[e, v.engine_version, terminal.verdict(v.verdict, colour), v.method or "-",
                      v.draft_architecture or "-", v.draft_quantization or "unquantized", ", ".join(v.reasons) or "-"]
                     for e, v in draft.verdicts.items()]))
    if draft.findings:
        out.append((f"MTP draft {draft.subfolder}/ findings", ["severity", "code", "message"],
                    [[terminal.severity(f.severity, colour), f.code + (f" [{f.engine}]" if f.engine else ""),
                      f.message + (f" Fix: {f.hint}" if f.hint else "") + (f" ({f.reference})" if f.reference else "")]
                     for f in sorted(draft.findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))]))
    return out


def _attention(cfg: Any) -> str:
    parts = [cfg.attention_kind]
    if cfg.num_attention_heads:
        parts.append(f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV")
    if cfg.layer_types:
        counts: dict[str, int] = {}
        for t in cfg.layer_types:
            counts[t] = counts.get(t, 0) + 1
        parts.append(", ".join(f"{n} {t}" for t, n in counts.items()))
    return "; ".join(parts)


def render_text(report: Any, *, width: int | None = None, colour: bool = False) -> str:
    """Terminal text; ``width`` wraps every table to that many columns (None: full width)."""
    blocks = []
    for title, headers, rows in sections(report, colour):
        blocks.append(f"{title}\n{'=' * len(title)}\n{terminal.table(headers, rows, width)}")
    if report.plan is not None:
        blocks.append(render_plan(report.plan, "text", width=width).rstrip("\n"))
    return "\n\n".join(blocks) + "\n"


def render_markdown(report: Any) -> str:
    """Markdown (GitHub tables cannot wrap a cell, so it is always full width)."""
    ck = report.checkpoint
    blocks = [f"# ckptinspect report: `{ck.ref}`"]
    for title, headers, rows in sections(report):
        clean = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
        hdr = headers if any(headers) else ["item", "value"]
        blocks.append(f"## {title}\n\n" + tabulate(clean, headers=hdr, tablefmt="github", disable_numparse=True))
    if report.plan is not None:
        blocks.append(render_plan(report.plan, "markdown").rstrip("\n"))
    return "\n\n".join(blocks) + "\n"
