"""The HTTP response fields the range client reads, parsed (pure functions, no I/O)."""

from __future__ import annotations

import re

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


def content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """``Content-Range: bytes a-b/N`` -> (a, b, N or None for ``*``); None when absent or unusable
    (a multipart/byteranges answer or a broken proxy has none)."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None
    total = match.group(3)
    return int(match.group(1)), int(match.group(2)), None if total == "*" else int(total)


def content_range_total(value: str | None) -> int | None:
    """The complete length a ``Content-Range`` names, None when absent or ``*``."""
    parsed = content_range(value)
    return parsed[2] if parsed is not None else None


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delay form; an HTTP date or garbage gives None)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
