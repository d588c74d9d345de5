"""`snapshot` output: what was written (stdout) and, with --verbose, how the source was read (stderr)."""

from __future__ import annotations

from typing import Any


def snapshot_summary(raw: Any, output: Any, size: int) -> str:
    """One line naming the file written, what it holds, and its size (``raw``: the saved RawCheckpoint)."""
    from ckptinspect.escape import escape_controls

    return escape_controls(f"wrote {output} ({len(raw.headers)} shard headers, {len(raw.json_files)} JSON files, "
            f"{size:,} bytes)")


def snapshot_stats(raw: Any) -> str:
    """Where the metadata came from, with the request count, bytes fetched, retries and wall time."""
    from ckptinspect.escape import escape_controls

    stats = raw.stats
    return escape_controls(f"source: {raw.kind} {raw.location}; requests: {stats.get('requests', 0)}, "
            f"bytes fetched: {stats.get('bytes_fetched', 0):,}, retries: {stats.get('retries', 0)}, "
            f"wall: {stats.get('wall_s', 0)} s")
