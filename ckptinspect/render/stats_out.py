"""``--verbose``: how a checkpoint was read (requests, bytes fetched, retries, revision), one stderr line
per checkpoint, the same words for every command."""

from __future__ import annotations

from typing import Any, Mapping


def stats_line(stats: Mapping[str, Any], wall_s: float, *, label: str = "") -> str:
    """``stats: requests=3, bytes_fetched=..., wall_s=0.12`` (``label``: which checkpoint, e.g. "A")."""
    from ckptinspect.escape import escape_controls

    values = {**stats, "wall_s": round(wall_s, 3)}
    head = f"stats {label}: " if label else "stats: "
    return escape_controls(head + ", ".join(f"{k}={v}" for k, v in values.items()))
