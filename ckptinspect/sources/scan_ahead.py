"""Scan Hub headers in a helper process while later headers are still on the wire.

Without this, the report scans the 94 headers of a 370k-tensor checkpoint (~0.9 CPU-s) only after the
last one has arrived, while during the fetch the client mostly waits on the network: on a server that
closes every connection (tests/plain_hub_server.py) the fetch is bound by its few requests in flight.
So the Hub reader forks one helper at its start, while it is still single-threaded (like the index
child, sources/index_prefetch.py), and hands it each header as it arrives: the fetch thread writes the
bytes into a shared memory file and sends their place (20 bytes) down a pipe. The helper scans them in
arrival order with the pipeline's own scan function, inherited through the fork (so ``hash()`` of a
name, which the index cross-check sums, is the parent's too). When the fetch is done the parent takes
the not-yet-started headers from the other end (a lock-protected claim per header: each is scanned
once), then receives the helper's scans.

The helper only ever saves work: a header it did not return - it failed on it, stopped, died, or the
pipe was full - is scanned by the parent, which then raises its own error for a bad header. Every scan
is the one function on the same bytes, so the result is the one a serial scan gives
(tests/test_hub_scan_ahead.py compares them).
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import struct
import threading
from multiprocessing import get_context
from typing import Any, Callable, Mapping

from ckptinspect.sources.interface import gc_paused, open_spool

ScanFn = Callable[[str, bytes, "int | None"], Any]

# Headers the helper can be handed (one claim byte each); later ones are scanned by the parent.
MAX_SLOTS = 1 << 16
# A record in the shared file: its head (the file size, -1 when unknown, then the shard name), the header.
# A message down the pipe: the slot, where the record starts, the head's length, the header's length.
_SIZE = struct.Struct("<q")
_MESSAGE = struct.Struct("<IQII")
_END = 0xFFFFFFFF
_FREE, _HELPER, _PARENT = 0, 1, 2
# The claim lock is held for a few byte operations; a holder that keeps it this long is stopped or
# dead, and the other side then goes on without it (the parent scans the rest itself).
LOCK_WAIT_S = 2.0
DISABLE_ENV = "CKPTINSPECT_SCAN_AHEAD"  # "0": scan after the fetch, in the report's own scan stage


class ScanAhead:
    """The helper process and its channels. Use ``feed`` from any thread, ``finish`` once, ``close`` always."""

    def __init__(self, scan: ScanFn, process: Any, spool: int, pipe_w: int, results: Any, claims: mmap.mmap,
                 lock: Any) -> None:
        self._scan = scan
        self._process = process
        self._spool = spool
        self._pipe_w: int | None = pipe_w
        self._results = results
        self._claims = claims
        self._lock = lock  # a process-shared lock: guards the claims
        self._feed_lock = threading.Lock()  # this process's threads: one slot order, one write offset
        self._end = 0
        self._slots: list[str] = []  # slot -> shard
        self.fed = 0  # headers the helper was handed

    @classmethod
    def start(cls, scan: ScanFn) -> "ScanAhead | None":
        """Fork the helper, or None where that is not safe (threads running) or possible."""
        if os.name != "posix" or threading.active_count() > 1 or os.environ.get(DISABLE_ENV, "1").strip() == "0":
            return None
        ctx = get_context("fork")
        try:
            spool = open_spool("headers")
            claims = mmap.mmap(-1, MAX_SLOTS)  # anonymous MAP_SHARED: the helper sees the parent's claims
            lock = ctx.Lock()
            pipe_r, pipe_w = os.pipe()
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_helper, args=(scan, spool, pipe_r, pipe_w, send, claims, lock), daemon=True)
            process.start()
        except (OSError, ValueError):
            return None
        os.close(pipe_r)
        send.close()
        os.set_blocking(pipe_w, False)  # a full pipe (a stalled helper) must never stall a fetch thread
        return cls(scan, process, spool, pipe_w, receive, claims, lock)

    def feed(self, shard: str, header: bytes, file_size: int | None) -> None:
        """Hand one header to the helper (called from the fetch threads as each header arrives)."""
        name = shard.encode("utf-8", "surrogatepass")
        head = _SIZE.pack(-1 if file_size is None else file_size) + name
        length = len(head) + len(header)
        with self._feed_lock:
            if self._pipe_w is None or len(self._slots) >= MAX_SLOTS:
                return
            offset, self._end = self._end, self._end + length
            slot = len(self._slots)
            try:
                if _write_at(self._spool, head, header, offset) != length:
                    raise OSError("short write")
                # under PIPE_BUF bytes: written whole or not at all
                os.write(self._pipe_w, _MESSAGE.pack(slot, offset, len(head), len(header)))
            except OSError:  # full pipe, gone helper, full memory file: the rest is the parent's
                self._stop_feeding()
                return
            self._slots.append(shard)
            self.fed += 1

    def finish(self, headers: Mapping[str, bytes], sizes: Mapping[str, int | None], wait_s: float) -> dict[str, Any]:
        """Every header of ``headers`` scanned: the helper's part plus the parent's (the slots not yet
        started, from the last one down, then any the helper did not return). Raises what the scan
        function raises for a bad header (the parent's own scan)."""
        with self._feed_lock:
            if self._pipe_w is not None:
                try:
                    os.write(self._pipe_w, _MESSAGE.pack(_END, 0, 0, 0))
                except OSError:
                    pass  # the helper is gone or behind a full pipe: it stops at EOF below
                self._stop_feeding()
            slots = list(self._slots)
        done: dict[str, Any] = {}
        with gc_paused():
            helper_alive = True
            for slot in range(len(slots) - 1, -1, -1):
                claimed = self._claim(slot)
                if claimed is None:  # the lock is held by a helper that is stopped or dead
                    helper_alive = False
                    break
                if not claimed:
                    break  # the helper has this one, so every earlier one too
                shard = slots[slot]
                if shard in headers:  # else a file read before the index that it does not name
                    done[shard] = self._scan(shard, headers[shard], sizes.get(shard))
            done.update((shard, scan) for shard, scan in self._helper_scans(wait_s if helper_alive else 0.0).items()
                        if shard in headers)
            for shard in headers:  # not handed over, not returned (failed, stopped, died): scanned here
                if shard not in done:
                    done[shard] = self._scan(shard, headers[shard], sizes.get(shard))
        return {shard: done[shard] for shard in headers}

    def close(self) -> None:
        """Stop the helper (its work is either received or not wanted) and release the channels."""
        self._stop_feeding()
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._results.close()
        if self._spool >= 0:
            os.close(self._spool)
            self._spool = -1
        self._claims.close()

    def _claim(self, slot: int) -> bool | None:
        """Take ``slot`` for the parent: True, or False when the helper has it; None when the lock
        cannot be had (its holder is stopped or was killed holding it)."""
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            return None
        try:
            if self._claims[slot] != _FREE:
                return False
            self._claims[slot] = _PARENT
            return True
        finally:
            self._lock.release()

    def _helper_scans(self, wait_s: float) -> dict[str, Any]:
        """The helper's scans; {} when it does not answer within ``wait_s`` or died (then it is stopped)."""
        try:
            if not self._results.poll(max(0.0, wait_s)):
                return {}
            return pickle.loads(self._results.recv_bytes())
        except (EOFError, OSError):
            return {}
        finally:
            if self._process.is_alive():
                self._process.kill()

    def _stop_feeding(self) -> None:
        if self._pipe_w is not None:
            os.close(self._pipe_w)
            self._pipe_w = None


def _helper(scan: ScanFn, spool: int, pipe_r: int, pipe_w: int, send: Any, claims: mmap.mmap, lock: Any) -> None:
    import gc

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then kills us
    gc.disable()  # header trees are acyclic and freed by refcounting (as in the report's scan workers)
    os.close(pipe_w)
    scans: dict[str, Any] = {}
    with os.fdopen(pipe_r, "rb") as messages:
        while True:
            message = messages.read(_MESSAGE.size)
            if len(message) < _MESSAGE.size:
                break  # the parent closed the pipe
            slot, offset, head_length, header_length = _MESSAGE.unpack(message)
            if slot == _END:
                break
            if not lock.acquire(timeout=LOCK_WAIT_S):
                break  # the parent was killed holding it
            try:
                taken = claims[slot] != _FREE  # by the parent, and so is every later one
                claims[slot] = claims[slot] if taken else _HELPER
            finally:
                lock.release()
            if taken:
                break
            head = os.pread(spool, head_length, offset)
            header = os.pread(spool, header_length, offset + head_length)
            (size,) = _SIZE.unpack_from(head)
            shard = head[_SIZE.size:].decode("utf-8", "surrogatepass")
            try:
                scans[shard] = scan(shard, header, None if size < 0 else size)
            except Exception:  # noqa: BLE001 - not swallowed: the parent scans this shard again and raises
                break
    try:
        send.send_bytes(pickle.dumps(scans, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:  # the parent is gone or stopped listening: nobody is left to tell
        pass
    finally:
        send.close()


def _write_at(fd: int, head: bytes, header: bytes, offset: int) -> int:
    """Write ``head`` then ``header`` at ``offset``: one vectored write where the OS has it (no copy of
    the header), else one write of the two joined."""
    if hasattr(os, "pwritev"):
        return os.pwritev(fd, [head, header], offset)
    return os.pwrite(fd, head + header, offset)


