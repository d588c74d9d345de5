"""`verify` output: the dry-load through the engine's own code as text (per module) or JSON
(schema: render/verify.schema.json)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ckptinspect.escape import escaped
from ckptinspect.verify.decide import target_copy_line
from ckptinspect.verify.records import TARGET_COPY

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("verify.schema.json")
MAX_LISTED = 20  # skipped MTP tensors named in text; JSON lists them all


def verify_json(result: Any) -> dict[str, Any]:
    """The JSON document of a verify.VerifyResult (keys of schema_version 1 are stable)."""
    result = escaped(result)
    doc = asdict(result)
    doc["schema_version"] = SCHEMA_VERSION
    for module in doc["modules"]:
        module["status"] = next(m.status for m in result.modules if m.module == module["module"])
    return doc


def verify_text(result: Any) -> str:
    """Summary lines, the steps, the per-module table, the skipped MTP tensors, the shims."""
    from tabulate import tabulate

    result = escaped(result)  # names and engine messages the checkpoint or the engine chose
    version = result.engine_version or "unknown version"
    lines = [f"{result.engine} {version} dry-load of {result.location}: {result.outcome.upper()}",
             f"engine python   {result.python}",
             f"draft           {result.draft_class or '-'} ({', '.join(result.draft_architectures) or '-'}), "
             f"method {result.method or '-'}, quantization {result.quantization or 'none'}"
             f"{f' ({result.quant_config})' if result.quant_config else ''}",
             f"tensors         {result.tensors_offered:,} offered: {result.mtp_tensors_loaded:,} MTP loaded, "
             f"{len(result.mtp_tensors_skipped):,} MTP skipped, {len(result.other_tensors_loaded):,} other loaded "
             f"({', '.join(result.other_tensors_loaded[:3])}), {result.other_tensors_skipped:,} other skipped",
             f"wall            {result.seconds:.1f} s"]
    if result.outcome == TARGET_COPY:
        lines.append(f"target copy     {target_copy_line(result)}")
    lines += ["", "Steps", "====="]
    for step in result.steps:
        mark = "ok" if step.ok else "FAILED"
        lines.append(f"{step.step:<36} {mark:<6} {step.seconds:.2f} s")
        if not step.ok:
            lines.append(f"  {step.error}" + ("  (the engine refuses this machine, not the checkpoint)"
                                             if step.platform else ""))
            if step.where:
                lines.append(f"  at {step.where}" + (f" loading {step.tensor}" if step.tensor else ""))
    if result.modules:
        rows = []
        for module in result.modules:
            for param in module.parameters:
                detail = "; ".join(param.problems) or (param.note or "")
                rows.append([module.module, param.name, param.dtype, "x".join(map(str, param.shape)) or "scalar",
                             param.status, param.source_count, detail])
        lines += ["", "Parameters the engine built (per module)", "========================================",
                  tabulate(rows, headers=["module", "parameter", "dtype", "shape", "status", "tensors", "detail"],
                           disable_numparse=True)]
    if result.mtp_tensors_skipped:
        lines += ["", "Stored MTP tensors the engine skipped", "====================================="]
        lines += list(result.mtp_tensors_skipped[:MAX_LISTED])
        if len(result.mtp_tensors_skipped) > MAX_LISTED:
            lines.append(f"... and {len(result.mtp_tensors_skipped) - MAX_LISTED} more (--format json lists all)")
    if result.shims or result.not_run:
        lines += ["", "Not the engine's own behaviour here", "==================================="]
        lines += [f"shim: {text}" for text in result.shims] + [f"not run: {text}" for text in result.not_run]
    return "\n".join(lines)


def render_verify(result: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(verify_json(result), indent=2)
    return verify_text(result)


def validate_verify_json(doc: dict[str, Any]) -> None:
    import jsonschema

    jsonschema.validate(doc, json.loads(SCHEMA_PATH.read_text()))
