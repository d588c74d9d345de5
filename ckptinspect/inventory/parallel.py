"""Scan every shard header of a checkpoint: in this process, or partly in one worker process when the
volume pays.

One scan for every source: the record is complete and eager (records.RawCheckpoint), so the scan reads
``raw.headers`` and the source's one ``index_summary`` and never asks which kind of source it holds;
headers a source already scanned as they arrived (the Hub reader's optional ``scan``) are used as they are.

The worker (``ScanWorker``, inventory/scan_process.py; its side in scan_worker.py) is an optional speed-up
for the second core. It is spawned when the Hub read starts (``read_starts``, so its interpreter start
overlaps the network), and the Hub reader's per-header hook feeds it each header as it arrives, so the
scan runs while this process is still receiving (local sources: see ``start_scan``). It is a fresh
interpreter started with ``subprocess`` (spawn semantics on every platform), and it is used only when it
pays: the index names ``MIN_WORKER_TENSORS`` or more, and a CPU stayed free while the read went on (measured
from /proc/stat, not guessed from the load average: inventory/cpu_idle.py); otherwise it is stopped as soon
as that is known. Never in a daemonic ``multiprocessing`` process. ``CKPTINSPECT_PARALLEL_SCAN=0`` turns it
off, ``=1`` forces it on for any volume, load and source (the tests' differential). Whatever it could not
answer (it did not start, broke, or a shard raised there) is scanned here, in index order, so the result,
errors included, is the in-process path's. No ``os.fork``, no ``gc.freeze``; the worker is gone when the
scan returns or fails, and dies with this process (its stdin ends). ``hash(str)`` is seeded per process, so
the worker gets the index too (the Hub's bytes, as they arrive) and does its side of the index cross-check
itself (scan_worker.py); this process then spends nothing on it.
"""

from __future__ import annotations

from ckptinspect.gc_pause import gc_paused
from ckptinspect.header.index import INDEX
from ckptinspect.inventory.scan import ShardScan, scan_header_unpaused
from ckptinspect.inventory.scan_process import ScanWorker, forced_on
from ckptinspect.progress import SILENT, Progress
from ckptinspect.records import IndexSummary, RawCheckpoint


def scan_checkpoint(raw: RawCheckpoint, progress: Progress = SILENT) -> tuple[list[ShardScan], IndexSummary | None]:
    """(one ShardScan per shard in the record's order, the index summary when there is an index)."""
    with start_scan(raw, progress) as scan:
        return scan.finish()


def start_scan(raw: RawCheckpoint, progress: Progress = SILENT, worker: ScanWorker | None = None) -> "Scan":
    """The scan of ``raw``, run by ``finish()`` (a context manager: it stops the worker when the caller
    fails first); ``progress`` hears "headers n/N" as it goes. ``worker``: the one the Hub reader fed as
    headers arrived (``worker_feed``), if any.

    A source that read every header before returning (a local directory, the HF cache) gets no worker:
    there it would only split the scan after the read, and on the 397B replica that measured no faster
    (BENCHMARKS.md section 20, 1.03x wall at load ~1.9). ``CKPTINSPECT_PARALLEL_SCAN=1`` still feeds it
    those headers, so the tests compare its scans with the in-process ones on every fixture."""
    if worker is None and forced_on():
        worker = ScanWorker()
    if worker is not None and forced_on():
        if isinstance(raw.json_files.get(INDEX), dict) and not worker.has_index:
            worker.index_parsed(raw.json_files[INDEX])
        done = raw.scan_plan.scanned if raw.scan_plan is not None else {}
        for shard, header in raw.headers.items():
            if shard not in done and shard not in worker.seen:
                worker.feed(shard, header, raw.file_sizes.get(shard))
    return Scan(raw, progress, worker)


def worker_feed() -> ScanWorker:
    """A worker to hand to a source as its per-header ``scan`` hook (``open_source(..., scan=worker)``), then
    to ``start_scan``. Only the ``hub`` source kind starts it (``read_starts``); it is used only if it pays."""
    return ScanWorker()


class Scan:
    """The scan of one checkpoint's headers."""

    def __init__(self, raw: RawCheckpoint, progress: Progress = SILENT, worker: ScanWorker | None = None) -> None:
        self.raw = raw
        self.progress = progress
        self.worker = worker

    def finish(self) -> tuple[list[ShardScan], IndexSummary | None]:
        """(one ShardScan per shard in the record's order, the index summary when there is an index).
        The first bad shard in that order raises, whoever met it first."""
        raw = self.raw
        scanned = dict(raw.scan_plan.scanned) if raw.scan_plan is not None else {}
        summary = raw.index_summary
        with gc_paused():  # the scans are acyclic: collections during the loop would find nothing
            if self.worker is not None and self.worker.settle():
                # the worker's share and, from the back of its backlog, this thread's (scan_process.py)
                self.progress.phase("scanning headers")
                scanned.update(self.worker.results(scan_header_unpaused, summary))
            todo = [s for s in raw.headers if s not in scanned]
            try:
                for done, shard in enumerate(todo):
                    self.progress.phase("scanning headers", done, len(todo))
                    scanned[shard] = scan_header_unpaused(shard, raw.headers[shard], raw.file_sizes.get(shard))
            finally:
                self.progress.end()
        return [scanned[s] for s in raw.headers], summary

    def close(self) -> None:
        """Stop and reap the worker, if one was started (idempotent)."""
        if self.worker is not None:
            self.worker.close()

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
