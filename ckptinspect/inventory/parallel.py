"""Scan every shard header of a checkpoint, in forked worker processes when that pays off.

On a 2-core machine the 370k-tensor replica has ~0.9 CPU-s of header work and ~0.4 CPU-s of index
parsing. The parent forks its workers directly (no executor: its feeder and result threads need the
GIL, which the parent's json.loads holds for milliseconds at a time, and its queued batches could not
be taken back, so the processes finished 50-100 ms apart). One worker parses the index first, which
returns only an IndexSummary. Every process then takes shards one at a time from a shared pipe of
shard numbers, largest shards first: the kernel hands each 4-byte read to exactly one reader, so no
shard is scanned twice and the processes finish within one small shard of each other. Each worker
sends its scans back in one pickle when the pipe is empty.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import struct
import traceback
from typing import Callable

from ckptinspect.errors import CkptInspectError
from ckptinspect.inventory.scan import ShardScan, scan_header_unpaused
from ckptinspect.records import IndexSummary, RawCheckpoint, ScanPlan
from ckptinspect.sources.index_summary import summarize_index
from ckptinspect.sources.interface import INDEX, gc_paused

# Worker processes pay off only with enough header JSON to parse: below this the fork and the result
# transfer (a few ms) cost more than they save.
PARALLEL_MIN_HEADER_BYTES = 4_000_000
WORKERS_ENV = "CKPTINSPECT_WORKERS"
_TOKEN = struct.Struct("<I")
# The shard numbers are written into the pipe before any process reads it, so they must fit its
# buffer (Linux: 64 KiB, and one 4 KiB page under pipe-user-pages limits; macOS: 16 KiB): 512 numbers
# are 2 KiB. Beyond 512 shards a number stands for a run of consecutive shards.
_MAX_TOKENS = 512
# More processes than this only add fork and result-transfer costs (and a typo of 1000 would fork 999).
_MAX_PROCESSES = 64


def scan_checkpoint(raw: RawCheckpoint) -> tuple[list[ShardScan], IndexSummary | None]:
    """(one ShardScan per shard in index order, the index summary when there is an index)."""
    with start_scan(raw) as scan:
        return scan.finish()


def start_scan(raw: RawCheckpoint) -> "Scan":
    """Start scanning ``raw``: worker processes fork now and the caller may work until ``finish()``.

    What the parent does in between (reading the config and rules) is absorbed by the scan: the parent
    takes fewer shards. Use as a context manager, so workers are stopped if the caller fails first."""
    processes = process_count(raw)
    return _ForkedScan(raw, processes - 1) if processes > 1 else _InProcessScan(raw)


class Scan:
    def finish(self) -> tuple[list[ShardScan], IndexSummary | None]:
        """(one ShardScan per shard in index order, the index summary when there is an index)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop and reap any worker still running (a no-op after finish)."""

    def __enter__(self) -> "Scan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _InProcessScan(Scan):
    def __init__(self, raw: RawCheckpoint) -> None:
        self.raw = raw

    def finish(self) -> tuple[list[ShardScan], IndexSummary | None]:
        raw = self.raw
        done = scan_plan(raw).scanned  # scanned by the source as the headers arrived
        with gc_paused():
            summary = _summary_in_process(raw)
            scans = [done[s] if s in done else scan_header_unpaused(s, raw.headers[s], raw.file_sizes.get(s))
                     for s in raw.headers]
        gc.freeze()  # the scans live until the report is rendered; never traverse them again
        return scans, summary


def _summary_in_process(raw: RawCheckpoint) -> IndexSummary | None:
    if raw.index_summary is not None or INDEX not in raw.json_files:
        return raw.index_summary
    return summarize_index(raw.json_files[INDEX], source=f"{raw.location}/{INDEX}")


class _Outcome:
    """What one process did: its scans, the index summary (first worker only), the errors it met."""

    def __init__(self) -> None:
        self.scans: list[ShardScan] = []
        self.summary: IndexSummary | None = None
        self.summary_error: BaseException | None = None
        self.errors: dict[str, BaseException] = {}  # shard -> the error that stopped this process


class _ForkedScan(Scan):
    def __init__(self, raw: RawCheckpoint, workers: int) -> None:
        self.raw = raw
        self.plan = plan = scan_plan(raw)
        # Largest first, so the shards taken last (when one process may already be idle) are the smallest.
        order = sorted(plan.early, key=lambda s: -(plan.early[s] or 0))
        per_token = max(1, -(-len(order) // _MAX_TOKENS))
        self.runs = [order[i:i + per_token] for i in range(0, len(order), per_token)]
        self.summarizer = _summarizer(raw, plan)
        self.children: list[tuple[int, int]] = []  # (pid, read end of its result pipe)
        self.tokens, tokens_write = os.pipe()
        try:
            _write_all(tokens_write, b"".join(map(_TOKEN.pack, range(len(self.runs)))))
        finally:
            os.close(tokens_write)  # every reader sees end-of-file once the numbers are taken
        gc.freeze()  # the workers must not traverse (and so copy) the parent's objects
        try:
            for number in range(workers):
                if not self._fork(self.summarizer if number == 0 else None):
                    break
        except BaseException:
            self.close()
            raise

    def _fork(self, summarizer: Callable[[], IndexSummary | None] | None) -> bool:
        result_read, result_write = os.pipe()
        try:
            pid = os.fork()
        except OSError:  # no process to spare: the parent scans what the others do not
            os.close(result_read)
            os.close(result_write)
            return False
        if pid == 0:  # the worker: never returns
            os.close(result_read)
            for _, other in self.children:
                os.close(other)
            _worker_main(self.raw, self.plan, self.runs, self.tokens, result_write, summarizer)
        os.close(result_write)
        self.children.append((pid, result_read))
        return True

    def finish(self) -> tuple[list[ShardScan], IndexSummary | None]:
        mine = _Outcome()
        try:
            with gc_paused():
                if not self.children and self.summarizer is not None:
                    _summarize(self.summarizer, mine)
                _take_shards(self.raw, self.plan, self.runs, self.tokens, mine)
                outcomes = [mine]
                while self.children:
                    outcomes.append(_collect(*self.children.pop(0)))  # _collect reaps it, even on error
        finally:
            self.close()
        return _assemble(self.raw, self.plan, outcomes, self.summarizer)

    def close(self) -> None:
        if self.tokens >= 0:
            os.close(self.tokens)
            self.tokens = -1
        while self.children:  # only when the parent failed: stop and reap the workers
            _kill(*self.children.pop())


def _summarizer(raw: RawCheckpoint, plan: ScanPlan) -> Callable[[], IndexSummary | None] | None:
    if raw.index_summary is not None:
        return None
    if plan.index_summarizer is not None:
        return plan.index_summarizer
    if INDEX in raw.json_files:  # already parsed (snapshot): summarized in the worker all the same
        return lambda: _summary_in_process(raw)
    return None


def _summarize(summarizer: Callable[[], IndexSummary | None], outcome: _Outcome) -> None:
    try:
        outcome.summary = summarizer()
    except Exception as exc:  # raised by the parent, before any shard error (the index names the shards)
        outcome.summary_error = _with_trace(exc)


def _take_shards(raw: RawCheckpoint, plan: ScanPlan, runs: list[list[str]], tokens: int, outcome: _Outcome) -> None:
    """Scan the shards behind each number read from the pipe until it is empty or a shard fails."""
    while True:
        token = os.read(tokens, _TOKEN.size)
        if not token:
            return
        # A pipe read of 4 bytes is atomic and the pipe holds only whole numbers: never a partial one.
        (number,) = _TOKEN.unpack(token)
        for shard in runs[number]:
            try:
                outcome.scans.append(scan_header_unpaused(shard, raw.headers[shard], plan.early[shard]))
            except Exception as exc:  # the report fails: stop here (the other processes finish the pipe)
                outcome.errors[shard] = _with_trace(exc)
                return


def _worker_main(raw: RawCheckpoint, plan: ScanPlan, runs: list[list[str]], tokens: int, result: int,
                 summarizer: Callable[[], IndexSummary | None] | None) -> None:
    """The forked child. It runs only the scan and raw os reads and writes: no stdio, logging or imports,
    so no lock that another thread of the parent held at the fork is ever waited for."""
    status = 1
    try:
        gc.disable()
        outcome = _Outcome()
        if summarizer is not None:
            _summarize(summarizer, outcome)
        if outcome.summary_error is None:
            _take_shards(raw, plan, runs, tokens, outcome)
        _write_all(result, _dumps(outcome))
        status = 0
    finally:
        os._exit(status)  # never the parent's cleanup, atexit hooks or buffered output


def _dumps(outcome: _Outcome) -> bytes:
    try:
        return pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an error that does not pickle: send its text instead
        outcome.summary_error = _portable(outcome.summary_error)
        outcome.errors = {shard: _portable(exc) for shard, exc in outcome.errors.items()}
        return pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)


def _portable(exc: BaseException | None) -> BaseException | None:
    if exc is None or isinstance(exc, CkptInspectError):
        return exc
    return RuntimeError("".join(traceback.format_exception(exc)))


def _with_trace(exc: Exception) -> Exception:
    """Errors of the tool pass as they are; anything else (a bug) keeps the worker's traceback."""
    if not isinstance(exc, CkptInspectError):
        exc.add_note("raised in a scan worker process:\n" + "".join(traceback.format_tb(exc.__traceback__)))
    return exc


def _collect(pid: int, fd: int) -> _Outcome:
    """Read one worker's outcome and reap it (the pickle is our own child's, never a file's)."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    if status != 0 or not chunks:
        raise CkptInspectError(f"a header-scan worker process ended without its results (wait status {status}); "
                               f"{WORKERS_ENV}=1 scans in one process")
    return pickle.loads(b"".join(chunks))


def _kill(pid: int, fd: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.close(fd)
    os.waitpid(pid, 0)


def _assemble(raw: RawCheckpoint, plan: ScanPlan, outcomes: list[_Outcome],
              summarizer: Callable[[], IndexSummary | None] | None) -> tuple[list[ShardScan], IndexSummary | None]:
    for outcome in outcomes:
        if outcome.summary_error is not None:
            raise outcome.summary_error
    summary = raw.index_summary if summarizer is None else next(
        (o.summary for o in outcomes if o.summary is not None), None)
    scans = dict(plan.scanned)  # scanned by the source as the headers arrived, if any
    scans.update((scan.shard, scan) for outcome in outcomes for scan in outcome.scans)
    errors = {shard: exc for outcome in outcomes for shard, exc in outcome.errors.items()}
    # The summary's shard list is the index's (validated there): the parent never parses the index.
    shards = list(summary.shards) if summary is not None else list(raw.headers)
    with gc_paused():
        for shard in shards:  # in index order: the error raised is the first bad shard's, whoever met it
            if shard in errors:
                raise errors[shard]
            if shard not in scans:  # not scanned (indexed but absent: raises here; or after a stop)
                scans[shard] = scan_header_unpaused(shard, raw.headers[shard], raw.file_sizes.get(shard))
    gc.freeze()
    return [scans[s] for s in shards], summary


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def scan_plan(raw: RawCheckpoint) -> ScanPlan:
    """The source's plan, or (headers already in memory) every shard at once with its exact volume."""
    if raw.scan_plan is not None:
        return raw.scan_plan
    return ScanPlan(early={s: raw.file_sizes.get(s) for s in raw.headers},
                    header_bytes=sum(len(v) for v in raw.headers.values()))


def process_count(raw: RawCheckpoint) -> int:
    """Processes to scan with, the parent included (1 = in-process); CKPTINSPECT_WORKERS overrides the count.

    The parent scans too, so a 2-core machine forks one worker. Fewer than two shards to scan early
    (one file, or a Hub source, whose headers were scanned as they arrived) always scan in-process."""
    if os.name != "posix":
        return 1
    configured = os.environ.get(WORKERS_ENV, "").strip()
    if configured and (not configured.isascii() or not configured.isdigit()
                       or not 1 <= int(configured) <= _MAX_PROCESSES):
        raise CkptInspectError(f"{WORKERS_ENV}={configured!r} must be a whole number from 1 to {_MAX_PROCESSES}")
    plan = scan_plan(raw)
    count = len(plan.early)
    if count < 2:
        return 1
    if configured:
        return min(int(configured), count)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if plan.header_bytes < PARALLEL_MIN_HEADER_BYTES or cpus < 2:
        return 1
    return min(cpus, count, 8)
