"""Scan every shard header of a checkpoint, in this process.

One scan for every source: the record is complete and eager (records.RawCheckpoint), so the scan reads
``raw.headers`` and the source's one ``index_summary`` and never asks which kind of source it holds;
headers a source already scanned as they arrived (the Hub reader's optional ``scan``) are used as they are.

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

from ckptinspect.gc_pause import gc_paused
from ckptinspect.inventory.scan import ShardScan, scan_header_unpaused
from ckptinspect.progress import SILENT, Progress
from ckptinspect.records import IndexSummary, RawCheckpoint


def scan_checkpoint(raw: RawCheckpoint, progress: Progress = SILENT) -> tuple[list[ShardScan], IndexSummary | None]:
    """(one ShardScan per shard in the record's order, the index summary when there is an index)."""
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
        """(one ShardScan per shard in the record's order, the index summary when there is an index).
        The first bad shard in that order raises, whoever met it first."""
        raw = self.raw
        scanned = dict(raw.scan_plan.scanned) if raw.scan_plan is not None else {}
        with gc_paused():  # the scans are acyclic: collections during the loop would find nothing
            todo = [s for s in raw.headers if s not in scanned]
            try:
                for done, shard in enumerate(todo):
                    self.progress.phase("scanning headers", done, len(todo))
                    scanned[shard] = scan_header_unpaused(shard, raw.headers[shard], raw.file_sizes.get(shard))
            finally:
                self.progress.end()
        return [scanned[s] for s in raw.headers], raw.index_summary

    def close(self) -> None:
        """Release what the scan holds (nothing in-process)."""

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
