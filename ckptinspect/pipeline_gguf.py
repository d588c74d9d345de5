"""The report pipeline for GGUF checkpoints: RawGguf -> Checkpoint (format "gguf") -> llama.cpp MTP verdict.

Same stages and records as pipeline.py: GGUF metadata stands in for config.json (config/gguf_config.py),
tensor infos for safetensors headers (inventory/gguf_inventory.py), ``general.file_type`` for the
declared quantization, and the MTP verdict comes from rules/engines/llamacpp.yaml
(readiness/gguf_mtp.py) instead of the family rules, which describe safetensors layouts.
"""

from __future__ import annotations

from typing import Any, Callable

from ckptinspect.config.gguf_config import gguf_declared, gguf_model_config
from ckptinspect.inventory.gguf_inventory import build_gguf_inventory
from ckptinspect.records import Checkpoint, Finding, Inventory, ModelConfig, MtpAssessment, TensorGroup
from ckptinspect.sources.gguf_files import RawGguf


def checkpoint_from_gguf(raw: RawGguf, *, expert_findings: Callable[[Inventory, ModelConfig], list[Finding]]) -> Checkpoint:
    """``expert_findings``: pipeline.py's routed-experts check (passed in: this module never imports pipeline)."""
    first_name, first = raw.parts[0]
    names = {t.name for _, h in raw.parts for t in h.tensors}
    config = gguf_model_config(first, names, source=f"{raw.location}/{first_name}")
    inventory = build_gguf_inventory(raw.parts, config.num_hidden_layers)
    findings: list[Finding] = list(expert_findings(inventory, config))
    projectors = [f for f in raw.files if f.rsplit("/", 1)[-1].lower().startswith("mmproj")]
    if projectors:
        findings.append(Finding("gguf-projector-present", "info",
                                f"vision projector file(s) next to the model ({', '.join(projectors[:3])}), "
                                "loaded with llama-server --mmproj; not part of this report", subject=projectors[0]))
    stats: dict[str, Any] = dict(raw.stats)
    stats["model_set"] = raw.model
    if raw.revision:
        stats["revision"] = raw.revision
    return Checkpoint(ref=raw.ref, kind=raw.kind, location=raw.location, files=raw.files, config=config,
                      declared=gguf_declared(first), inventory=inventory, findings=tuple(findings), family=None,
                      stats=stats, format="gguf")


def assess_gguf(checkpoint: Checkpoint, raw: RawGguf, *, engine_version: str | None = None) -> MtpAssessment:
    from ckptinspect.readiness.gguf_mtp import assess_gguf_mtp

    return assess_gguf_mtp(checkpoint, raw.parts, raw.companions, version=engine_version)


def companion_head_groups(checkpoint: Checkpoint, raw: RawGguf, mtp: MtpAssessment) -> tuple[TensorGroup, ...]:
    """The tensor groups of the NextN head when it ships in a companion ``mtp-*.gguf``, numbered as the
    trunk's blocks after the last (``diff`` compares them with a head inside the model). A head of its own
    architecture (blocks from 0: Gemma 4's assistant) is no NextN block of the trunk and gives none."""
    model_files = {s.name for s in checkpoint.inventory.shards}
    head_files = {f for layer in mtp.layers for f in layer.shards} - model_files
    parts = [(name, header) for name, header in raw.companions if name in head_files]
    if not parts:
        return ()
    groups = build_gguf_inventory(parts, checkpoint.config.num_hidden_layers).groups
    return tuple(g for g in groups if g.mtp_layer is not None)
