"""`report --format json`: the versioned JSON contract (schema: render/report.schema.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptinspect.records import MtpAssessment
from ckptinspect.render.findings import finding_json
from ckptinspect.render.plan_json import plan_json  # not plan_out: JSON output needs no table or terminal code
from ckptinspect.render.summary import bucket_json, by_component, by_scheme, experts_present

if TYPE_CHECKING:
    from ckptinspect.plan.mtp_cost import MtpCost

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def report_to_json(report: Any) -> dict[str, Any]:
    """The JSON document of a pipeline.Report (keys of schema_version 1 are stable)."""
    ck = report.checkpoint
    cfg = ck.config
    inv = ck.inventory
    present = experts_present(ck)
    findings = list(ck.findings) + (list(report.mtp.findings) if report.mtp else [])
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "format": ck.format,
        "source": {"ref": ck.ref, "kind": ck.kind, "location": ck.location,
                   "revision": ck.stats.get("revision")},
        "model": {
            "architecture": cfg.architecture, "model_type": cfg.model_type, "family": ck.family,
            "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
            "text_model_type": cfg.text_model_type, "vocab_size": cfg.vocab_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "attention_kind": cfg.attention_kind,
            "layer_types": _count(cfg.layer_types),
            "max_position_embeddings": cfg.max_position_embeddings,
            "remote_code": cfg.has_remote_code,
        },
        "totals": {"tensors": inv.totals.tensors, "params": inv.totals.params, "bytes": inv.totals.bytes},
        "experts": {
            "routed": cfg.routed_experts, "per_token": cfg.experts_per_token, "shared": cfg.shared_experts,
            "moe_intermediate_size": cfg.moe_intermediate_size, **present,
        },
        "quantization": {
            "declared": ck.declared.label,
            "method": ck.declared.method, "algo": ck.declared.algo, "kv_cache": ck.declared.kv_cache,
            "group_size": ck.declared.group_size,
            "block_size": list(ck.declared.block_size) if ck.declared.block_size else None,
            "sources": list(ck.declared.sources),
            "excludes": [{"source": e.source, "semantics": e.semantics, "entries": len(e.entries)}
                         for e in ck.declared.excludes],
            "schemes": {k: bucket_json(v) for k, v in by_scheme(inv).items()},
        },
        "components": by_component(inv),
        # a GGUF ShardInfo's header_length is its whole header (magic to data section); safetensors adds the prefix
        "shards": {"count": len(inv.shards),
                   "header_bytes": sum(s.header_length + (8 if ck.format == "safetensors" else 0) for s in inv.shards),
                   "files": [s.name for s in inv.shards]},
        "mtp": mtp_to_json(report.mtp),
        "findings": [finding_json(f) for f in findings],
    }
    if getattr(report, "engine_checks", ()):  # report --verify-engine (verify/decide.py)
        from ckptinspect.verify.decide import engine_json

        for check in report.engine_checks:
            doc["mtp"]["engines"][check.engine].update(engine_json(check))
    if report.mtp_costs:
        doc["mtp"]["cost"] = [mtp_cost_json(c) for c in report.mtp_costs]
    if getattr(report, "drafts", ()):
        doc["mtp"]["drafts"] = [draft_json(d) for d in report.drafts]
    if report.plan is not None:
        if type(report.plan).__name__ == "LlamaCppPlan":  # a GGUF's llama-server plan
            from ckptinspect.render.llamacpp_plan_out import llamacpp_plan_json

            doc["plan"] = llamacpp_plan_json(report.plan)
        else:
            doc["plan"] = plan_json(report.plan)
    if ck.stats:
        doc["source"]["stats"] = {k: v for k, v in ck.stats.items() if isinstance(v, (int, float, str))}
    return doc


def mtp_to_json(mtp: MtpAssessment | None) -> dict[str, Any]:
    if mtp is None:
        return {"declared_key": None, "declared_layers": None, "present_layers": 0, "tensors": 0, "params": 0,
                "bytes": 0, "schemes": {}, "complete": False, "verdict": {"sglang": "absent", "vllm": "absent"}}
    return {
        "declared_key": mtp.declared_key, "declared_layers": mtp.declared_layers,
        "present_layers": mtp.present_layers, "tensors": mtp.tensors, "params": mtp.params, "bytes": mtp.bytes,
        "schemes": dict(mtp.schemes), "complete": mtp.complete,
        "verdict": {engine: v.verdict for engine, v in mtp.verdicts.items()},
        "family": mtp.family,
        "engines": {engine: {
            "verdict": v.verdict, "engine_version": v.engine_version, "draft_architecture": v.draft_architecture,
            "method": v.method, "draft_quantization": v.draft_quantization, "layers_used": v.layers_used,
            "reasons": list(v.reasons)} for engine, v in mtp.verdicts.items()},
        "layers": [{
            "k": layer.k, "prefix": layer.prefix, "tensors": layer.tensors, "params": layer.params,
            "bytes": layer.bytes, "schemes": dict(layer.schemes), "missing": list(layer.missing),
            "experts_present": layer.experts_present, "experts_expected": layer.experts_expected,
            "shards": list(layer.shards)} for layer in mtp.layers],
        "modules": [{
            "module": m.module, "component": m.component, "declared": m.declared, "stored": m.stored,
            "engines": {engine: {"built": m.built[engine], "reason": m.reasons[engine], "cause": m.causes[engine],
                                 "matches_stored": m.matches[engine]} for engine in m.built}}
            for m in mtp.modules],
    }


def draft_json(draft: Any) -> dict[str, Any]:
    """One draft subfolder the family declares (records.DraftAssessment): its status, and when present its
    own MTP assessment (the draft's tensors are its MTP tensors) and source."""
    doc: dict[str, Any] = {
        "subfolder": draft.subfolder, "family": draft.family, "status": draft.status, "location": draft.location,
        "reference": draft.reference,
        "verdict": {engine: v.verdict for engine, v in draft.verdicts.items()},
        "engines": {engine: {"verdict": v.verdict, "engine_version": v.engine_version,
                             "draft_architecture": v.draft_architecture, "method": v.method,
                             "draft_quantization": v.draft_quantization, "reasons": list(v.reasons)}
                    for engine, v in draft.verdicts.items()},
        "findings": [finding_json(f) for f in draft.findings],
    }
    if draft.checkpoint is not None and draft.mtp is not None:
        ck = draft.checkpoint
        doc["matched_family"] = ck.family
        doc["declared_quantization"] = ck.declared.label
        doc["totals"] = {"tensors": ck.inventory.totals.tensors, "params": ck.inventory.totals.params,
                         "bytes": ck.inventory.totals.bytes}
        doc["shards"] = [s.name for s in ck.inventory.shards]
        doc["mtp"] = mtp_to_json(draft.mtp)
    return doc


def mtp_cost_json(cost: MtpCost) -> dict[str, Any]:
    """One `report --tp/--ep` MTP cost (plan/mtp_cost.py MtpCost)."""
    return {"tp": cost.tp, "ep": cost.ep, "params": cost.params, "bytes": cost.bytes,
            "loaded_bytes": cost.loaded_bytes, "expert_bytes": cost.expert_bytes,
            "bytes_per_gpu": cost.bytes_per_gpu, "total_bytes_per_gpu": cost.total_bytes_per_gpu,
            "share_per_gpu": round(cost.share_per_gpu, 6)}


def _count(items: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False)


def validate_report_json(doc: dict[str, Any]) -> None:
    """Validate against the shipped JSON Schema (jsonschema imported lazily: it is slow to import)."""
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validate(doc, schema)
