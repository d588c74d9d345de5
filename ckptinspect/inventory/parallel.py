"""Scan every shard header of a checkpoint, in this process.

One scan for every source: headers already scanned by the source as they arrived (the Hub reader),
headers in memory (a snapshot), headers on disk (a local directory or the HF cache, read on access).

No worker processes and no ``gc.freeze``: a library call must work inside a daemonic
``multiprocessing`` worker, under the ``spawn`` start method, on Windows and macOS, and leave nothing
behind. A ``spawn``-started ``concurrent.futures`` pool was built and measured on the 371k-tensor replica
(BENCHMARKS.md, "Scan without forks"): on this project's 2-core machine under load its start-up
(a fresh interpreter and the scanner's imports per worker) cost more than the ~1 CPU-s scan it split,
and per-process string hashing (the index cross-check's name fingerprint) differs between spawned
processes. So the scan stays in-process; the pipeline's ``start_scan`` / ``finish`` seam is where a
parallel scan would go if a measurement shows it pays.
"""

from __future__ import annotations

from typing import Mapping

from ckptinspect.inventory.scan import ShardScan, scan_header_unpaused
from ckptinspect.progress import SILENT, Progress
from ckptinspect.records import IndexSummary, RawCheckpoint, ScanPlan
from ckptinspect.sources.index_summary import summarize_index
from ckptinspect.sources.interface import INDEX, gc_paused


def scan_checkpoint(raw: RawCheckpoint, progress: Progress = SILENT) -> tuple[list[ShardScan], IndexSummary | None]:
    """(one ShardScan per shard in index order, the index summary when there is an index)."""
    with start_scan(raw, progress) as scan:
        return scan.finish()


def start_scan(raw: RawCheckpoint, progress: Progress = SILENT) -> "Scan":
    """The scan of ``raw``, run by ``finish()`` (a context manager, so a future parallel scan that starts
    work early can stop it when the caller fails first); ``progress`` hears "headers n/N" as it goes."""
    return Scan(raw, progress)


class Scan:
    """The scan of one checkpoint's headers."""

    def __init__(self, raw: RawCheckpoint, progress: Progress = SILENT) -> None:
        self.raw = raw
        self.progress = progress

    def finish(self) -> tuple[list[ShardScan], IndexSummary | None]:
        """(one ShardScan per shard in index order, the index summary when there is an index)."""
        with gc_paused():  # the scans are acyclic: collections during the loop would find nothing
            summary = _summary_in_process(self.raw)
            try:
                return _assemble(self.raw, summary, dict(scan_plan(self.raw).scanned), {}, self.progress), summary
            finally:
                self.progress.end()

    def close(self) -> None:
        """Release what the scan holds (nothing in-process)."""

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _summary_in_process(raw: RawCheckpoint) -> IndexSummary | None:
    if raw.index_summary is not None or INDEX not in raw.json_files:
        return raw.index_summary
    return summarize_index(raw.json_files[INDEX], source=f"{raw.location}/{INDEX}")


def _assemble(raw: RawCheckpoint, summary: IndexSummary | None, scanned: dict[str, ShardScan],
              errors: Mapping[str, BaseException], progress: Progress = SILENT) -> list[ShardScan]:
    """The scans in index order; a shard not scanned yet is scanned here, and the error raised is the
    first bad shard's in index order, whoever met it."""
    shards = list(summary.shards) if summary is not None else list(raw.headers)
    total, done = sum(s not in scanned for s in shards), 0
    for shard in shards:
        if shard in errors:
            raise errors[shard]
        if shard not in scanned:  # indexed but absent raises here (the source's one-line error)
            progress.phase("scanning headers", done, total)
            scanned[shard] = scan_header_unpaused(shard, raw.headers[shard], raw.file_sizes.get(shard))
            done += 1
    return [scanned[s] for s in shards]


def scan_plan(raw: RawCheckpoint) -> ScanPlan:
    """The source's plan, or (headers already in memory) every shard at once with its exact volume."""
    if raw.scan_plan is not None:
        return raw.scan_plan
    return ScanPlan(early={s: raw.file_sizes.get(s) for s in raw.headers},
                    header_bytes=sum(len(v) for v in raw.headers.values()))
