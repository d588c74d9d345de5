"""Scan every shard header of a checkpoint, in forked worker processes when that pays off.

On a 2-core machine the 370k-tensor replica has ~0.9 CPU-s of header work and ~0.4 CPU-s of index
parsing. Everything is submitted up front (one GIL-holding json.loads in the main thread would
otherwise starve the pool's feeder thread); the index is parsed in a worker, which returns only an
IndexSummary; and the main process, instead of idling, takes pending batches back from the end of
the queue (work stealing) until the workers have started on everything else.
"""

from __future__ import annotations

import gc
import os
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from ckptinspect.inventory.scan import ShardScan, scan_header_unpaused
from ckptinspect.records import IndexSummary, RawCheckpoint, ScanPlan
from ckptinspect.sources.index_summary import summarize_index
from ckptinspect.sources.interface import INDEX, gc_paused

# Worker processes pay off only with enough header JSON to parse: below this the pool start-up
# (tens of ms) costs more than it saves.
PARALLEL_MIN_HEADER_BYTES = 4_000_000
# Batches per worker: small enough for the main process to steal a fair share, large enough to keep
# inter-process traffic negligible.
BATCHES_PER_WORKER = 12
WORKERS_ENV = "CKPTINSPECT_WORKERS"

_Batch = list[tuple[str, "int | None"]]

# Set before the pool forks so workers read headers from the inherited source, not from pickles.
_SOURCE: RawCheckpoint | None = None


def scan_checkpoint(raw: RawCheckpoint) -> tuple[list[ShardScan], IndexSummary | None]:
    """(one ShardScan per shard in index order, the index summary when there is an index)."""
    processes = process_count(raw)
    if processes <= 1:
        done = scan_plan(raw).scanned  # scanned by the source as the headers arrived
        with gc_paused():
            summary = _summary_in_process(raw)
            scans = [done[s] if s in done else scan_header_unpaused(s, raw.headers[s], raw.file_sizes.get(s))
                     for s in raw.headers]
        gc.freeze()  # the scans live until the report is rendered; never traverse them again
        return scans, summary
    return _scan_parallel(raw, processes - 1)


def _summary_in_process(raw: RawCheckpoint) -> IndexSummary | None:
    if raw.index_summary is not None or INDEX not in raw.json_files:
        return raw.index_summary
    return summarize_index(raw.json_files[INDEX], source=f"{raw.location}/{INDEX}")


def _scan_parallel(raw: RawCheckpoint, workers: int) -> tuple[list[ShardScan], IndexSummary | None]:
    global _SOURCE
    headers = raw.headers
    plan = scan_plan(raw)
    _SOURCE = raw
    gc.freeze()  # children must not traverse (and so copy) the parent's objects
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork"),
                                 initializer=gc.disable) as pool:
            summary_future: Future | None = None
            if raw.index_summary is None and plan.index_summarizer is not None:
                summary_future = pool.submit(plan.index_summarizer)  # the early shards are scanned meanwhile
            elif raw.index_summary is None and INDEX in raw.json_files:  # parsed (snapshot): summarize there
                summary_future = pool.submit(_summary_in_worker)
            batches = _balanced_batches(dict(plan.early), (workers + 1) * BATCHES_PER_WORKER)
            futures = [pool.submit(_scan_batch, batch) for batch in batches]
            with gc_paused():
                scans: dict[str, ShardScan] = {}
                for future, batch in zip(reversed(futures), reversed(batches)):
                    if future.cancel():  # not started yet: the main process does it
                        scans.update((s.shard, s) for s in _scan_batch(batch))
                summary = summary_future.result() if summary_future is not None else _summary_in_process(raw)
                for future in futures:
                    if not future.cancelled():
                        scans.update((s.shard, s) for s in future.result())
                # The summary's shard list is the index's (validated there): the parent never parses it.
                shards = list(summary.shards) if summary is not None else list(headers)
                for shard in shards:
                    if shard not in scans:  # indexed but not scanned early (e.g. missing: raises here)
                        scans[shard] = scan_header_unpaused(shard, headers[shard], raw.file_sizes.get(shard))
            return [scans[s] for s in shards], summary
    finally:
        _SOURCE = None


def scan_plan(raw: RawCheckpoint) -> ScanPlan:
    """The source's plan, or (headers already in memory) every shard at once with its exact volume."""
    if raw.scan_plan is not None:
        return raw.scan_plan
    return ScanPlan(early={s: raw.file_sizes.get(s) for s in raw.headers},
                    header_bytes=sum(len(v) for v in raw.headers.values()))


def _summary_in_worker() -> IndexSummary | None:
    assert _SOURCE is not None
    return _summary_in_process(_SOURCE)


def _scan_batch(batch: _Batch) -> list[ShardScan]:
    source = _SOURCE
    assert source is not None
    return [scan_header_unpaused(shard, source.headers[shard], size) for shard, size in batch]


def _balanced_batches(sizes: dict[str, int | None], count: int) -> list[_Batch]:
    """Split shards into ``count`` batches of similar total size (largest first, greedy)."""
    batches: list[_Batch] = [[] for _ in range(count)]
    load = [0] * count
    for shard, size in sorted(sizes.items(), key=lambda kv: -(kv[1] or 0)):
        i = load.index(min(load))
        batches[i].append((shard, size))
        load[i] += size or 1
    return [b for b in batches if b]


def process_count(raw: RawCheckpoint) -> int:
    """Processes to scan with, the main one included (1 = in-process); CKPTINSPECT_WORKERS overrides.

    The main process scans too (it steals batches), so a 2-core machine runs one pool worker."""
    if os.name != "posix":
        return 1
    configured = os.environ.get(WORKERS_ENV)
    if configured:
        return max(1, int(configured))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    plan = scan_plan(raw)
    volume, count = plan.header_bytes, len(plan.early)
    if volume < PARALLEL_MIN_HEADER_BYTES or count < 2 or cpus < 2:
        return 1
    return min(cpus, count, 8)
