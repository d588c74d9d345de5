"""The parent's side of the optional scan worker process (inventory/parallel.py; the child's side and the
pipe protocol: inventory/scan_worker.py; starting it and trusting its answers: scan_child.py).

A report's worker lives through one Hub read:

1. ``read_starts`` (the ``hub`` source kind calls it as the read begins): the CPUs are sampled
   (inventory/cpu_idle.py), and a timer spawns the worker ``SPAWN_CHECK_S`` later if they stayed free
   meanwhile (its interpreter start and imports then overlap the index download), else never.
2. ``index_arrives`` (the Hub reader, with the index bytes as they arrived): the CPUs are sampled again
   over the whole read so far; if a CPU stayed free (cpu_idle.worker_pays) the child gets the index (it
   parses it while this process does, for its side of the index cross-check: scan_worker.py) and every
   header after it, through a writer thread (a pipe write blocks while the child is busy; the caller's
   thread must not); if not, it is stopped and the report scans in-process as without it.
3. ``expect`` (the Hub reader, the index summarized): under ``MIN_WORKER_TENSORS`` it is stopped. ``feed``
   (the per-header hook) hands each header on, measuring again: a CPU taken since stops the feed.
4. ``results`` scans what the child has not taken yet here, from the back, and reads the child's answers;
   ``close`` kills and reaps whatever is left (a failed read closes it too: pipeline.py).

Any failure to start or to talk to the child leaves ``results`` empty for the shards it did not answer:
the caller scans those itself, so a broken worker costs time, never a different result.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from typing import Any, Callable

from ckptinspect.errors import CkptInspectError
from ckptinspect.inventory.scan_child import (PARALLEL_ENV, claim_slot, forced_on, read_answers, release_slot,
                                              spawn_child, trusted_answers, worker_allowed)

# subprocess, pickle and inventory/cpu_idle.py are imported when a Hub read starts a worker, not before: a local
# report never needs them.

# Tensors the index must name for the worker to run. The scan costs ~1.9 CPU-us per tensor (0.7 CPU-s for
# the 371k of the Qwen3.5-397B replica); the worker path costs this process a few CPU-ms (the spawn, the
# writer thread, the answers) and the child ~0.07 CPU-s to start plus its own parse of the index: below
# ~50k tensors (a ~0.1 s scan) the share it moves is not worth a second interpreter.
MIN_WORKER_TENSORS = 50_000
# How long after the read starts the CPUs are sampled again to decide whether to spawn the worker: 15 ticks
# per CPU (cpu_idle.MIN_WINDOW_TICKS is 10), and the index of a large checkpoint (41 MB for 371k tensors)
# takes longer than this plus the worker's start-up (~0.07 s) to arrive, so the worker is ready for it.
SPAWN_CHECK_S = 0.15
# False: the caller never scans from the backlog, the worker scans every shard it was fed (the tests'
# differential, so that it compares the worker's scans with the in-process ones, not the caller's).
SHARE_WITH_CALLER = True


def _optional(method: Callable[..., Any]) -> Callable[..., Any]:
    """The worker is an optional speed-up: whatever goes wrong in one of its hooks (a thread that cannot
    start, a pipe that breaks) stops the worker and returns None, never fails the read or the scan."""
    @functools.wraps(method)
    def hook(self: "ScanWorker", *args: Any) -> Any:
        try:
            return method(self, *args)
        except Exception:  # noqa: BLE001 - see above; the caller scans in-process
            self.broken = True
            self.close()
            return None
    return hook


class ScanWorker:
    """One report's scan worker: spawned when the read starts, used when a CPU is free and the volume pays.

    Fed headers wait in ``backlog``; the writer thread takes them from the front, and ``results``
    (called once the source has read everything) scans the rest here from the back until none is left,
    so both processes stay busy to the end and neither waits long for the other."""

    def __init__(self) -> None:
        self.forced = forced_on()
        self.allowed = os.environ.get(PARALLEL_ENV, "").strip() != "0"  # the rest is asked when it would start
        self.decision: bool | None = True if self.forced else None  # None: not measured yet
        self.first: Any = None  # cpu_idle.CpuSample when the read started
        self.cpus: set[int] | None = None
        self.held: list[tuple[str, bytes, int | None]] = []
        self.index: tuple[str, Any] | None = None  # the index for the child, sent before any header
        self.has_index = False
        self.lock = threading.RLock()  # index_arrives runs in the Hub reader's thread, the spawn in a timer's
        self.timer: threading.Timer | None = None
        self.mark: Any = None  # (cpu_idle.CpuSample, the worker's ticks) when last measured while fed
        self.draining = False  # measured busy while fed: no more headers for it
        self.counted = False  # holds one of MAX_LIVE_WORKERS
        self.seen: set[str] = set()  # every shard fed
        self.sent: list[str] = []
        self.proc: Any = None  # the subprocess.Popen
        self.backlog: collections.deque = collections.deque()
        self.ready = threading.Condition()
        self.ending = False
        self.writer: threading.Thread | None = None
        self.broken = False
        self.worker_scanned = 0  # shards the worker answered (set by results)

    started = property(lambda self: self.proc is not None)

    @_optional
    def read_starts(self) -> None:
        """The Hub read begins: sample the CPUs; the worker is spawned SPAWN_CHECK_S later if they were free
        meanwhile (its start-up then overlaps the index download), else never (no cost on a busy machine)."""
        if not self.allowed or self.proc is not None:
            return
        if not self.forced:
            from ckptinspect.inventory import cpu_idle

            self.first = cpu_idle.read_sample()
            self.cpus = cpu_idle.usable_cpus()
            if self.first is None:  # no /proc/stat: decide now, from the CPU count and the load average
                self.decision = cpu_idle.spare_core_without_proc_stat(os.cpu_count(), cpu_idle.load_average())
            elif self.cpus is not None and len(self.cpus) < 2:
                self.decision = False
            if self.decision is False:
                self.allowed = False
                return
        if self.forced or self.decision:
            self._start()
            return
        self.timer = threading.Timer(SPAWN_CHECK_S, self._spawn_check)
        self.timer.daemon = True
        self.timer.start()

    @_optional
    def _spawn_check(self) -> None:
        """The timer's thread. It never waits for the lock: whoever holds it checks again (index, header)."""
        if self.lock.acquire(blocking=False):
            try:
                self._spawn_if_free()
            finally:
                self.lock.release()

    def _spawn_if_free(self) -> None:
        """Spawn the worker if the CPUs stayed free since the read started (called with the lock held)."""
        if self.proc is not None or not self.allowed or self.first is None:
            return
        from ckptinspect.inventory import cpu_idle

        now = cpu_idle.read_sample()
        verdict = None if now is None else cpu_idle.worker_pays(self.first, now, self.cpus)
        if verdict:
            self._start()
        elif verdict is False:
            self._stop_unused()

    @_optional
    def expect(self, summary: Any) -> None:
        """The index is in (an IndexSummary, or None without one): too few tensors stop the worker."""
        tensors = sum(summary.counts.values()) if summary is not None else 0
        if not self.forced and tensors < MIN_WORKER_TENSORS:
            self._stop_unused()

    @_optional
    def index_arrives(self, data: bytes) -> None:
        """The Hub reader's index bytes, as they arrived (before this process parses them): the child
        parses and summarizes the same bytes meanwhile, for its side of the index cross-check."""
        self._give_index(("index-bytes", data))

    @_optional
    def index_parsed(self, index: Any) -> None:  # a local source's, when forced on: pickled to the child
        self._give_index(("index", index))

    def _give_index(self, message: tuple[str, Any]) -> None:
        with self.lock:
            if not self.allowed:
                return
            self.index, self.has_index = message, True
            self._spawn_now()
            if self.proc is None:
                return
            if self.decision is None:
                self._decide(final=False)
            elif self.decision:
                self._push([])

    def __call__(self, shard: str, header: bytes, file_size: int | None) -> None:  # the per-header hook
        self.feed(shard, header, file_size)

    @_optional
    def feed(self, shard: str, header: bytes, file_size: int | None) -> None:
        """The source's per-header hook (returns None: the source keeps nothing for it)."""
        self.seen.add(shard)
        if not self.allowed or self.broken:
            return
        with self.lock:
            self._spawn_now()
            if not self.allowed:
                return
            if self.decision is None:  # held until the CPUs are measured over a window that tells
                self.held.append((shard, header, file_size))
                if self.proc is not None:
                    self._decide(final=False)
            elif self.decision and self.proc is not None:
                self._recheck()
                if not self.draining:
                    self._push([(shard, header, file_size)])

    def _spawn_now(self) -> None:
        """Forced on: start at once; else, if the timer has not spawned it yet, check now."""
        if self.proc is None and self.allowed:
            if self.forced:
                self._start()
            else:
                self._spawn_if_free()

    def _decide(self, *, final: bool) -> None:
        """Sample the CPUs again: a free CPU over the window starts the feed, a busy one stops the worker;
        a window too short to tell waits for the next header, or (``final``) stops the worker."""
        from ckptinspect.inventory import cpu_idle

        second = cpu_idle.read_sample()
        verdict = None
        if self.first is not None and second is not None and self.proc is not None:
            verdict = cpu_idle.worker_pays(self.first, second, self.cpus, cpu_idle.process_ticks(self.proc.pid))
        if verdict is None and not final:
            return
        if not verdict:
            self._stop_unused()
            return
        self.decision = True
        self.mark = (second, cpu_idle.process_ticks(self.proc.pid))
        items, self.held = self.held, []
        self._push(items)

    def _recheck(self) -> None:
        """While it is fed: if since the last look the CPUs were no longer free (the worker's own ticks
        count as free: they are what it got), it gets nothing more; it answers what it has, and this
        process scans the rest. A worker that competes with other work for a core slows this process too."""
        if self.forced or self.draining or self.mark is None or self.proc is None:
            return
        from ckptinspect.inventory import cpu_idle

        now, own = cpu_idle.read_sample(), cpu_idle.process_ticks(self.proc.pid)
        verdict = None if now is None else cpu_idle.worker_pays(self.mark[0], now, self.cpus, own - self.mark[1])
        if verdict is None:  # too short a window yet
            return
        self.mark = (now, own)
        if not verdict:
            self.draining = True
            with self.ready:
                self.backlog.clear()  # never sent: scanned here (parallel.Scan.finish)
                self.ending = True
                self.ready.notify()

    @_optional
    def settle(self) -> bool:
        """Whether the worker takes part in this scan: decided now if the read ended before a window long
        enough to tell (the caller, once the source has read everything)."""
        with self.lock:
            if self.proc is not None and self.decision is None:
                self._decide(final=True)
            if not self.decision:  # never spawned (a busy CPU, a read too short), or measured busy
                self._stop_unused()
            self._recheck()
            return self.proc is not None

    def _stop_unused(self) -> None:
        self.decision, self.allowed, self.held, self.index = False, False, [], None
        self.close()

    def _push(self, items: list[tuple[str, bytes, int | None]]) -> None:
        if self.writer is None:
            self.writer = threading.Thread(target=self._write, name="ckptinspect-scan-feed", daemon=True)
            self.writer.start()
        with self.ready:
            self.backlog.extend(items)
            self.ready.notify()

    def _start(self) -> bool:
        counted = not self.forced and claim_slot()  # one worker per process (scan_child.MAX_LIVE_WORKERS)
        self.proc = spawn_child() if (counted or self.forced) and worker_allowed() else None
        if self.proc is None:
            self.allowed, self.held = False, []
            if counted:
                release_slot()
        self.counted = counted and self.proc is not None
        return self.proc is not None

    def _write(self) -> None:
        """The writer thread: pickle each header into the child's stdin (the write releases the GIL)."""
        import pickle

        proc = self.proc
        assert proc is not None and proc.stdin is not None
        try:
            with self.ready:
                index, self.index = self.index, None
            if index is not None:
                pickle.dump(index, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.flush()
                del index
            while True:
                with self.ready:
                    while not self.backlog and not self.ending:
                        self.ready.wait()
                    if not self.backlog:
                        break
                    item = self.backlog.popleft()
                    self.sent.append(item[0])
                pickle.dump(item, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.flush()
            pickle.dump(None, proc.stdin)
            proc.stdin.flush()
        except (OSError, ValueError):  # the child is gone, or close() closed the pipe
            self.broken = True
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def _take_last(self) -> tuple[str, bytes, int | None] | None:
        with self.ready:
            return self.backlog.pop() if self.backlog else None

    def results(self, scan_here: Callable[[str, bytes, "int | None"], Any], summary: Any) -> dict[str, Any]:
        """shard -> ShardScan for every shard scanned by the worker or, from the back of the backlog, by
        ``scan_here`` in this thread; {} when the worker is not used. A shard whose scan raises is left out
        (the caller scans it again in order and raises there); so is all the worker's share if it broke or
        read the index differently from ``summary`` (this process's IndexSummary, None without an index).
        The worker's scans get ``summary``'s name fingerprint where the child found the names equal to the
        index's, and a different one where not, so the cross-check reads them as the in-process scans."""
        if not self.settle():
            return {}
        proc = self.proc
        assert proc is not None
        self._push([])  # the writer runs (it ends the child's input below), even if nothing was fed
        done: dict[str, Any] = {}
        while SHARE_WITH_CALLER and (item := self._take_last()) is not None:
            try:
                done[item[0]] = scan_here(*item)
            except CkptInspectError:
                pass
        with self.ready:
            self.ending = True
            self.ready.notify()
        if self.writer is not None:
            self.writer.join()
        answered: dict[str, Any] = {}
        try:
            assert proc.stdout is not None
            if not self.broken:
                answered = trusted_answers(read_answers(proc.stdout), set(self.sent), summary)
        except Exception:  # noqa: BLE001 - a child that died or wrote garbage: its share is scanned again
            answered = {}
        self.close()
        self.worker_scanned = len(answered)
        done.update(answered)
        return done

    def close(self) -> None:
        """Stop the child and reap it, join the writer (idempotent). After ``results`` the child has
        already exited; before (the caller failed first) it is killed: its work is not wanted."""
        with self.lock:  # the timer's thread spawns under it (and never waits for it: no deadlock below)
            self.allowed = False
            timer, self.timer = self.timer, None
            proc, self.proc = self.proc, None
            if self.counted:
                self.counted = False
                release_slot()
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():  # the timer itself found the CPUs busy
                timer.join()
        if proc is None:
            return
        self.broken = True
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if self.writer is not None:
            with self.ready:
                self.ending = True
                self.backlog.clear()
                self.ready.notify()
            self.writer.join()
            self.writer = None
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass

