"""`audit` output: one row per repo as text, markdown, JSON (the sorted rows in one document) or JSONL
(one line per repo, written as each finishes). The row layout is docs/json_contract.md's "audit rows".

Every value comes from the row (ckptinspect/audit/row.py), which reads it from the repo's own report
document; nothing here computes a verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ckptinspect.render.summary import human_bytes, stored_label

AUDIT_SCHEMA_VERSION = 1
AUDIT_SCHEMA_PATH = Path(__file__).with_name("audit.schema.json")


def validate_audit_json(doc: dict[str, Any]) -> None:
    """Validate an audit document or one JSONL row against the shipped schema (jsonschema: lazily)."""
    import jsonschema

    jsonschema.validate(doc, json.loads(AUDIT_SCHEMA_PATH.read_text()))


def row_json(row: Any, *, full: bool = False) -> dict[str, Any]:
    """The JSON object of one row; ``full`` adds the repo's whole report document."""
    out: dict[str, Any] = {"repo": row.repo, "revision": row.revision, "status": "ok" if row.ok else "error",
                           "cached": row.cached}
    if not row.ok:
        out["error"] = {"kind": row.error.kind, "message": row.error.message}
        return out
    f = row.fields
    out.update({
        "format": f["format"], "family": f["family"], "declared": f["declared"],
        "stored_schemes": list(f["stored_schemes"]), "bytes": f["bytes"], "params": f["params"],
        "mtp": {"declared_layers": f["mtp_declared"], "present_layers": f["mtp_present"],
                "complete": f["mtp_complete"], "schemes": list(f["mtp_schemes"])},
        "verdict": dict(f["verdicts"]), "error_findings": f["errors"], "worst_finding": f["worst_finding"],
        "fit": f["fit"],
    })
    if f.get("engine_checks"):  # --verify-engine
        out["engine_check"] = {e: {k: c[k] for k in ("decided", "engine_version", "outcome", "rules_verdict",
                                                    "agrees", "not_decided", "modules")}
                               for e, c in f["engine_checks"].items()}
    if full:
        out["report"] = row.report
    return out


def jsonl_line(row: Any, *, full: bool = False) -> str:
    return json.dumps(row_json(row, full=full), separators=(",", ":")) + "\n"


def render_audit(rows: Sequence[Any], fmt: str, *, width: int | None = None, colour: bool = False,
                 full: bool = False, gpu: str | None = None, gpus: int | None = None) -> str:
    """``rows`` (already sorted) as ``fmt`` ("text", "markdown", "json" or "jsonl")."""
    if fmt == "json":
        doc = {"schema_version": AUDIT_SCHEMA_VERSION, "repos": len(rows),
               "readable": sum(1 for r in rows if r.ok), "rows": [row_json(r, full=full) for r in rows]}
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "jsonl":
        return "".join(jsonl_line(r, full=full) for r in rows)
    return _table(rows, fmt, width=width, colour=colour, fit=gpu is not None, gpu_label=f"{gpus}x {gpu}")


def _size(nbytes: int) -> str:
    """Binary units, as `report` and `plan` print the same bytes (GiB = 2**30 B)."""
    return human_bytes(nbytes)


def _mtp(f: dict[str, Any]) -> str:
    declared = f["mtp_declared"]
    if not declared and not f["mtp_present"]:
        return "none"
    text = f"{f['mtp_present']}/{declared if declared is not None else '?'}"
    text += " complete" if f["mtp_complete"] else " incomplete"
    if f["mtp_schemes"]:
        text += " " + "+".join(f["mtp_schemes"])
    return text


def _fit(fit: dict[str, Any] | None) -> str:
    if fit is None:
        return ""
    used, least = fit["gpus_used"], fit["min_gpus"]
    if not fit["fits"]:
        return "no" + (f" (needs {least})" if least and used and least > used else "")
    return f"yes, {used} used" + (f", min {least}" if least and least < used else "") + \
        (" (solver settings)" if fit["reason"] else "")


def _engines(rows: Sequence[Any]) -> list[str]:
    """A verdict column per engine any row was judged for: SGLang and vLLM first, then others."""
    seen: dict[str, None] = {}
    for row in rows:
        if row.ok:
            seen.update(dict.fromkeys(row.fields["verdicts"]))
    seen = seen or dict.fromkeys(["sglang", "vllm"])  # nothing judged (no readable repo): the usual two
    first = [e for e in ("sglang", "vllm") if e in seen]
    return first + [e for e in seen if e not in first]


def _worst(worst: dict[str, Any] | None, fmt: str) -> str:
    """The code in a terminal table (the message is the report's; `report REPO` or JSON shows it)."""
    if worst is None:
        return "none"
    return f"{worst['severity']} {worst['code']}" + (f": {worst['message']}" if fmt == "markdown" else "")


def _table(rows: Sequence[Any], fmt: str, *, width: int | None, colour: bool, fit: bool, gpu_label: str) -> str:
    from ckptinspect.render.terminal import table, verdict

    engines = _engines(rows)
    headers = ["repo", "quant", "size", "MTP", *engines] + ([f"fits {gpu_label}"] if fit else []) + \
        ["worst finding" if fmt == "markdown" else "worst"]
    body = []
    for row in rows:
        if not row.ok:
            cells = [row.repo, "-", "-", "-", *["-"] * len(engines)] + (["-"] if fit else []) + \
                [f"{row.error.kind}: {row.error.message}" if fmt == "markdown" else row.error.kind]
        else:
            f = row.fields
            worst = f["worst_finding"]
            stored = stored_label(f.get("stored_shares") or {}, f["bytes"], top=1)
            quant = f"{f['declared']} / {stored}" if f["declared"] else stored
            v = f["verdicts"]
            shown = quant if f["format"] == "safetensors" else f"{quant} ({f['format']})"
            cells = [row.repo, shown, _size(f["bytes"]), _mtp(f),
                     *[verdict(v[e], colour and fmt == "text") if e in v else "-" for e in engines]] + \
                ([_fit(f["fit"])] if fit else []) + \
                [_worst(worst, fmt)]
        body.append(cells)
    readable = sum(1 for r in rows if r.ok)
    summary = f"{len(rows)} repos, {readable} read, {len(rows) - readable} could not be read"
    if fmt == "markdown":
        from tabulate import tabulate

        cleaned = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in body]
        return tabulate(cleaned, headers=headers, tablefmt="github") + f"\n\n{summary}\n" + \
            (f"\n{_checks(rows)}" if _checks(rows) else "")
    errors = [f"{r.repo}: {r.error.kind}: {r.error.message}" for r in rows if not r.ok]
    return table(headers, body, width) + f"\n{summary}\n" + "".join(f"  {e}\n" for e in errors) + _checks(rows)


def _checks(rows: Sequence[Any]) -> str:
    """--verify-engine: one line per repo and engine, the dry-load's answer (the verdict column follows it)."""
    lines = [f"  {r.repo}: {e}: {c['line']}\n" for r in rows if r.ok
             for e, c in r.fields.get("engine_checks", {}).items()]
    return "engine check (the engine's own dry-load decides):\n" + "".join(lines) if lines else ""
