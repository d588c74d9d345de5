"""Engine version ranges of rule files (``"<0.33"``, ``">=0.5.10, <0.6"``)."""

from __future__ import annotations

import operator
import re

_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
_CLAUSE = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*([0-9][0-9a-z.]*)\s*$")


def version_tuple(text: str) -> tuple[int, ...]:
    """Numeric release parts; a pre-release tail (``0.33.0rc1``) counts as its release."""
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() != len(piece):
            break
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def in_range(version: str, spec: str) -> bool:
    """True when ``version`` satisfies every comma-separated clause of ``spec``."""
    current = version_tuple(version)
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"bad version clause {clause!r}")
        if not _OPS[m.group(1)](current, version_tuple(m.group(2))):
            return False
    return True


def representative(spec: str) -> str:
    """Some version inside ``spec`` (to evaluate a defect "as if" the engine were that old/new)."""
    bounds = [m.group(2) for m in (_CLAUSE.match(c) for c in spec.split(",")) if m]
    for candidate in ("0.0.0", *bounds, "9999.0.0"):
        if in_range(candidate, spec):
            return candidate
    for bound in bounds:  # strict bounds: step just above / below
        parts = list(version_tuple(bound))
        for delta in (1, -1):
            probe = ".".join(str(p) for p in (*parts[:-1], max(parts[-1] + delta, 0)))
            if in_range(probe, spec):
                return probe
    return bounds[0] if bounds else "0.0.0"
