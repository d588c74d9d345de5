"""Talking to the scan worker process (inventory/scan_process.py drives it; its side: scan_worker.py):
whether and how it is started, the pipe it is fed through, and which of its answers may stand for this
process's."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

PARALLEL_ENV = "CKPTINSPECT_PARALLEL_SCAN"  # "0": never; "1": for any volume, load and source; unset: when it pays
PIPE_BYTES = 1 << 20  # the pipe to the child, where the platform lets it be set (widen_pipe)
# The child's command: argv[1] is the directory holding the ckptinspect package.
CHILD_COMMAND = ("import sys; sys.path.insert(0, sys.argv[1]); "
                 "from ckptinspect.inventory.scan_worker import main; sys.exit(main())")


def forced_on() -> bool:
    """CKPTINSPECT_PARALLEL_SCAN=1: the worker for any volume, load and source (tests, benchmarks)."""
    return os.environ.get(PARALLEL_ENV, "").strip() == "1"


def worker_allowed() -> bool:
    """Whether this process may start the worker at all (the issue's rules, and the switch)."""
    if os.environ.get(PARALLEL_ENV, "").strip() == "0":
        return False
    # A daemonic pool worker may have no children of its own (a multiprocessing child has imported it).
    process = sys.modules.get("multiprocessing.process")
    if process is not None and process.current_process().daemon:
        return False
    return bool(sys.executable)  # an embedding interpreter without one cannot start a Python child


# Workers alive at once in one process (forced ones aside): reports run in threads (an audit) would each
# measure the same free CPU and start one; the first takes it, the others scan in-process.
MAX_LIVE_WORKERS = 1
_SLOTS_LOCK = threading.Lock()
_live = 0


def claim_slot() -> bool:
    global _live
    with _SLOTS_LOCK:
        if _live >= MAX_LIVE_WORKERS:
            return False
        _live += 1
        return True


def release_slot() -> None:
    global _live
    with _SLOTS_LOCK:
        _live -= 1


def spawn_child() -> Any:
    """A fresh interpreter running scan_worker.main with two pipes (subprocess: spawn semantics on every
    platform), or None where it cannot start."""
    import subprocess

    try:
        proc = subprocess.Popen([sys.executable, "-c", CHILD_COMMAND, str(Path(__file__).resolve().parents[2])],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    widen_pipe(proc.stdin)
    return proc


def widen_pipe(pipe: Any) -> None:
    """Let the pipe to the child hold a header or two (Linux: F_SETPIPE_SZ, up to 1 MiB without privileges;
    elsewhere it stays as it is). With the default 64 KiB every header write blocks until the child has
    read it, and the writer thread then waits for the GIL (up to the 5 ms switch interval while this
    process is busy) before it can send the next one, so the child would idle between headers."""
    try:
        import fcntl

        command = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only (Python 3.10+); never a guessed number
        if command is not None:
            fcntl.fcntl(pipe.fileno(), command, PIPE_BYTES)
    except (ImportError, OSError, ValueError):
        pass


def read_answers(stream: Any) -> Any:
    """The child's one reply, unpickled with only the scan's two record classes allowed: the stream comes
    from our own child, but a pickle may name any importable callable, so nothing else is resolved
    (inventory/scan.py's ShardScan and GroupTally are all that ``(index_check, answers)`` holds)."""
    import pickle

    class ScanRecords(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module == "ckptinspect.inventory.scan" and name in ("ShardScan", "GroupTally"):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not a scan record")

    return ScanRecords(stream).load()


def trusted_answers(reply: Any, sent: set[str], summary: Any) -> dict[str, Any]:
    """The child's scans that can stand for this process's: only if it summarized the same index (counts
    and name lengths per shard equal), each with this process's name fingerprint or a different one."""
    check, answers = reply
    if summary is not None and check != (dict(summary.counts), dict(summary.name_bytes)):
        return {}
    out = {}
    for shard, scan, names_match in answers:
        if scan is None or shard not in sent:
            continue
        if summary is not None:
            want = summary.name_hashes.get(shard, 0)
            scan = replace(scan, name_hash=want if names_match is True else want ^ 1)
        out[shard] = scan
    return out
