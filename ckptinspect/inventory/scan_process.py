"""The parent's side of the optional scan worker process (inventory/parallel.py decides when; the child's
side and the pipe protocol: inventory/scan_worker.py).

``feed`` is called with each header as a source reads it; headers are held here until their bytes reach
``MIN_WORKER_HEADER_BYTES``, then the worker starts and gets them, and every later one, through a
writer thread (a pipe write blocks while the child is busy; the caller's thread must not). ``results``
scans what the child has not taken yet here, ends the input and reads the child's answers; ``close``
kills and reaps whatever is left. Any failure
to start or to talk to the child leaves ``results`` empty for the shards it did not answer: the caller
scans those itself, so a broken worker costs time, never a different result.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ckptinspect.errors import CkptInspectError

# Header bytes fed before a worker starts. The scan costs ~16 CPU-ms per MB of headers (0.79 CPU-s for the
# 50 MB of the 371k-tensor replica) and the worker takes about half of it; its start (a fresh interpreter
# importing the scanner: ~0.05 s) and the pipe cost ~0.1 s, so below ~16 MB (a ~0.25 s scan) the half it
# moves is not worth it (BENCHMARKS.md "scan25").
MIN_WORKER_HEADER_BYTES = 16_000_000
# A second process pays only with a core to run on. Measured on 2 CPUs shared with other work (remote report
# of the 397B replica, worker on / off, BENCHMARKS.md "scan25"): 0.80-0.83x wall at load 1.4-2.0, 0.95x at
# load 3.5 (within the noise), so over 1.5 runnable tasks per CPU it is left off.
MAX_LOAD_PER_CPU = 1.5
PARALLEL_ENV = "CKPTINSPECT_PARALLEL_SCAN"  # "0": never; "1": for any volume; unset: when it pays
# False: the caller never scans from the backlog, the worker scans every shard it was fed (the tests'
# differential, so that it compares the worker's scans with the in-process ones, not the caller's).
SHARE_WITH_CALLER = True
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the ckptinspect package
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from ckptinspect.inventory.scan_worker import main; sys.exit(main())")


def forced_on() -> bool:
    """CKPTINSPECT_PARALLEL_SCAN=1: the worker for any volume, load and source (tests, benchmarks)."""
    return os.environ.get(PARALLEL_ENV, "").strip() == "1"


def worker_allowed() -> bool:
    """Whether this process may start the worker at all (the issue's rules, and the switch)."""
    switch = os.environ.get(PARALLEL_ENV, "").strip()
    if switch == "0":
        return False
    if multiprocessing.current_process().daemon:  # a daemonic pool worker: no children of its own
        return False
    if not sys.executable:  # an embedding interpreter without one cannot start a Python child
        return False
    return switch == "1" or _spare_core()


def _spare_core() -> bool:
    """At least two CPUs for this process, and the load leaves one free (no load average: assume so)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cpus = os.cpu_count() or 1
    if cpus < 2:
        return False
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return True
    return load < cpus * MAX_LOAD_PER_CPU


class ScanWorker:
    """One report's scan worker: fed header by header, started when the volume pays.

    Fed headers wait in ``backlog``; the writer thread takes them from the front, and ``results``
    (called once the source has read everything) scans the rest here from the back until none is left,
    so both processes stay busy to the end and neither waits long for the other."""

    def __init__(self, min_bytes: int | None = None) -> None:
        self.min_bytes = 0 if forced_on() else (MIN_WORKER_HEADER_BYTES if min_bytes is None else min_bytes)
        self.allowed = worker_allowed()
        self.held: list[tuple[str, bytes, int | None]] = []
        self.held_bytes = 0
        self.seen: set[str] = set()  # every shard fed
        self.sent: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.backlog: collections.deque = collections.deque()
        self.ready = threading.Condition()
        self.ending = False
        self.writer: threading.Thread | None = None
        self.broken = False
        self.worker_scanned = 0  # shards the worker answered (set by results)

    @property
    def started(self) -> bool:
        return self.proc is not None

    def feed(self, shard: str, header: bytes, file_size: int | None) -> None:
        """The source's per-header hook (returns None: the source keeps nothing for it)."""
        self.seen.add(shard)
        if not self.allowed or self.broken:
            return
        if self.proc is None:
            self.held.append((shard, header, file_size))
            self.held_bytes += len(header)
            if self.held_bytes < self.min_bytes or not self._start():
                return
            items, self.held = self.held, []
        else:
            items = [(shard, header, file_size)]
        with self.ready:
            self.backlog.extend(items)
            self.ready.notify()

    def _start(self) -> bool:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, _PACKAGE_ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, close_fds=True)
        except (OSError, ValueError, subprocess.SubprocessError):
            self.allowed = False
            self.held = []
            return False
        self.writer = threading.Thread(target=self._write, name="ckptinspect-scan-feed", daemon=True)
        self.writer.start()
        return True

    def _write(self) -> None:
        """The writer thread: pickle each header into the child's stdin (the write releases the GIL)."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        try:
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

    def results(self, scan_here: Callable[[str, bytes, "int | None"], Any]) -> dict[str, Any]:
        """shard -> ShardScan for every shard scanned by the worker or, from the back of the backlog, by
        ``scan_here`` in this thread; {} when the worker never started. A shard whose scan raises is left
        out (the caller scans it again in order and raises there); so is all the worker's share if it broke."""
        self.held = []
        proc = self.proc
        if proc is None:
            return {}
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
        try:
            assert proc.stdout is not None
            answers = [] if self.broken else pickle.load(proc.stdout)
        except Exception:  # noqa: BLE001 - a child that died or wrote garbage: its share is scanned again
            answers = []
        self.close()
        sent = set(self.sent)
        answered = {shard: scan for shard, scan in answers if scan is not None and shard in sent}
        self.worker_scanned = len(answered)
        done.update(answered)
        return done

    def close(self) -> None:
        """Stop the child and reap it, join the writer (idempotent). After ``results`` the child has
        already exited; before (the caller failed first) it is killed: its work is not wanted."""
        proc, self.proc = self.proc, None
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
