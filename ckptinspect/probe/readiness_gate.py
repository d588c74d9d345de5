"""Refuse to probe a checkpoint without a usable MTP layer, quoting the readiness verdict.

Uses the project's readiness stage (``ckptinspect.pipeline.load_checkpoint`` +
``ckptinspect.readiness.assess_mtp``) when it is importable; otherwise a presence check of the
family's required MTP tensors from the safetensors headers.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.errors import CkptInspectError, ProbeError
from ckptinspect.probe.heads import HeadSpec, text_model_type


def _project_verdict(ref: str) -> dict[str, Any] | None:
    try:
        from ckptinspect.pipeline import load_checkpoint  # type: ignore[attr-defined]
        from ckptinspect.readiness import assess_mtp  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        checkpoint = load_checkpoint(ref)
        try:
            assessment = assess_mtp(checkpoint)
        except TypeError:  # signature assess_mtp(checkpoint, family, ruleset)
            from ckptinspect.readiness import load_rules  # type: ignore[attr-defined]

            rules = load_rules()
            assessment = assess_mtp(checkpoint, rules.match(checkpoint.config), rules)
    except CkptInspectError:
        raise
    except Exception:  # noqa: BLE001 - the readiness stage is being written; never block the probe on it
        return None
    verdicts = {e: v.verdict for e, v in getattr(assessment, "verdicts", {}).items()}
    reasons = sorted({r for v in getattr(assessment, "verdicts", {}).values() for r in v.reasons})
    return {"source": "ckptinspect.readiness", "present_layers": assessment.present_layers,
            "complete": assessment.complete, "verdicts": verdicts, "reasons": reasons}


def check_mtp_usable(ref: str, model_dir: str, config: Mapping[str, Any], metas: Mapping[str, Any],
                     spec: HeadSpec | None) -> dict[str, Any]:
    verdict = _project_verdict(ref)
    if verdict is not None:
        usable = verdict["present_layers"] > 0 and any(v in ("ready", "degraded") for v in verdict["verdicts"].values())
        if not usable:
            quoted = ", ".join(f"{e}: {v}" for e, v in verdict["verdicts"].items()) or "no MTP layer"
            why = f" ({', '.join(verdict['reasons'])})" if verdict["reasons"] else ""
            raise ProbeError(f"no usable MTP layer — readiness verdict {quoted}{why}", path=model_dir)
    if spec is None:
        raise ProbeError(f"no MTP probe head for model_type {text_model_type(config)!r} "
                         "(supported: DeepSeek-V3/GLM-4.x, Qwen3-Next/Qwen3.5, MiMo-7B, ERNIE-4.5)", path=model_dir)
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    num_layers = int(text.get("num_hidden_layers", config.get("num_hidden_layers", 0)))
    prefix = spec.concrete_prefix(num_layers)
    present = [n for n in metas if n.startswith(prefix)]
    missing = [r for r in spec.required if prefix + r not in metas]
    if verdict is None:
        verdict = {"source": "probe presence check", "prefix": prefix, "tensors": len(present),
                   "missing": missing, "verdicts": {}}
        if not present or missing:
            what = "no tensors" if not present else f"missing {', '.join(prefix + m for m in missing)}"
            raise ProbeError(f"no usable MTP layer — readiness verdict absent: {what} under {prefix!r}",
                             path=model_dir)
    return verdict
