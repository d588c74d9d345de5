"""JSON form of a records.Finding (shared by the report and diff JSON documents)."""

from __future__ import annotations

from typing import Any

from ckptinspect.records import Finding

_OPTIONAL = ("engine", "subject", "reference", "hint")


def finding_json(finding: Finding) -> dict[str, Any]:
    """code, severity, message, then each optional field that is set (absent keys, never nulls)."""
    out: dict[str, Any] = {"code": finding.code, "severity": finding.severity, "message": finding.message}
    for key in _OPTIONAL:
        value = getattr(finding, key)
        if value is not None:
            out[key] = value
    return out
