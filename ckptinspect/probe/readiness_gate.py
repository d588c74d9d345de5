"""Refuse to probe a checkpoint without a usable MTP layer, quoting the report's own verdict.

The verdict is the report pipeline's MTP assessment (``ckptinspect.pipeline`` -> ``Report.mtp``),
the same one ``ckptinspect report`` prints. It fails closed: no assessment, no engine that would use
the layer, no ``probe:`` head for the family, or a tensor the head needs missing -> ProbeError. The
head check is an extra condition on top of the verdict, never a replacement for it.
"""

from __future__ import annotations

from typing import Any

from ckptinspect.errors import ProbeError
from ckptinspect.probe.heads import HeadSpec

USABLE = ("ready", "degraded")


def check_mtp_usable(probe_ckpt, spec: HeadSpec | None, model_dir: str) -> dict[str, Any]:
    """The readiness record the result carries; raises ProbeError when the probe cannot run."""
    report = probe_ckpt.report
    mtp = report.mtp
    if mtp is None:
        raise ProbeError("no usable MTP layer — the report has no MTP assessment for this checkpoint", path=model_dir)
    verdicts = {engine: v.verdict for engine, v in sorted(mtp.verdicts.items())}
    reasons = sorted({r for v in mtp.verdicts.values() for r in v.reasons})
    if mtp.present_layers == 0 or not any(v in USABLE for v in verdicts.values()):
        quoted = ", ".join(f"{e}: {v}" for e, v in verdicts.items()) or "none"
        why = f" ({', '.join(reasons)})" if reasons else ""
        raise ProbeError(f"no usable MTP layer — readiness verdict {quoted}{why}", path=model_dir)
    family = report.checkpoint.family
    if spec is None:
        from ckptinspect.readiness import load_rules

        with_head = sorted(f.id for f in load_rules().concrete() if f.document.get("probe"))
        raise ProbeError(f"no MTP probe head for family {family!r} (its rule file has no probe: block; "
                         f"families with one: {', '.join(with_head)})", path=model_dir)
    prefix = spec.concrete_prefix(report.checkpoint.config.num_hidden_layers)
    missing = [prefix + r for r in spec.required if prefix + r not in probe_ckpt.metas]
    if missing:
        raise ProbeError(f"no usable MTP layer — the {spec.id} probe head needs {', '.join(missing)}, "
                         f"absent from the checkpoint (readiness verdict "
                         f"{', '.join(f'{e}: {v}' for e, v in verdicts.items())})", path=model_dir)
    return {"source": "ckptinspect report pipeline", "family": family, "present_layers": mtp.present_layers,
            "complete": mtp.complete, "verdicts": verdicts, "reasons": reasons}
