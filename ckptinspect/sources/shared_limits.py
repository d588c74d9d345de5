"""Limits that several Hub reads of one process share: a bound on requests in flight across all of
them, and one deadline for all of them (``ckptinspect audit`` runs many repos' reads at once, each in
its own thread with its own event loop: sources/hub.py).

A caller installs them for the reads its thread starts::

    limiter = RequestLimiter(64)
    with shared_limits(SharedLimits(limiter, ends_at=time.monotonic() + 300)):
        api.inspect("org/name")          # every request of this read holds one of the 64 slots

They travel in a ``ContextVar``: a read in another thread, or a plain ``inspect()`` call, is not touched.
``open_hub`` reads them once and hands them to its helper thread. Each read keeps its own byte budget.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

from ckptinspect.errors import NetworkError


class RequestLimiter:
    """At most ``limit`` requests in flight, counted across threads and their event loops.

    An ``asyncio.Semaphore`` belongs to one loop; this one is shared: a slot freed in one thread is handed
    to the longest waiter in any thread (through its loop's ``call_soon_threadsafe``), so waiting never
    blocks a loop. ``close()`` ends every waiting and later ``acquire`` with a NetworkError (an audit that
    was stopped: its reads end at their next request instead of running on).
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a request limit must be at least 1")
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.closed = False
        self._lock = threading.Lock()
        self._waiters: collections.deque[_Waiter] = collections.deque()

    async def acquire(self, where: str) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            self._raise_if_closed(where)
            if self.used < self.limit and not self._waiters:
                self._take()
                return
            waiter = _Waiter(loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:  # cancelled (or closed) while waiting: give back a slot handed over meanwhile
            with self._lock:
                if waiter.state == "waiting":
                    self._waiters.remove(waiter)
            if waiter.state == "granted":
                self.release()
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:  # the slot passes straight to the next waiter: ``used`` stays the same
                waiter = self._waiters.popleft()
                try:
                    waiter.loop.call_soon_threadsafe(_grant, waiter.future)
                except RuntimeError:  # that waiter's loop has closed: try the next
                    waiter.state = "gone"
                    continue
                waiter.state = "granted"
                return
            self.used -= 1

    def close(self) -> None:
        with self._lock:
            self.closed = True
            waiters, self._waiters = list(self._waiters), collections.deque()
            for waiter in waiters:
                waiter.state = "failed"
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):
                waiter.loop.call_soon_threadsafe(_fail, waiter.future)

    def _take(self) -> None:
        self.used += 1
        self.peak = max(self.peak, self.used)

    def _raise_if_closed(self, where: str) -> None:
        if self.closed:
            raise NetworkError("stopped: the command that started this read was interrupted", path=where)


class _Waiter:
    """One ``acquire`` waiting; ``state`` (changed under the limiter's lock) says who owns its slot."""

    __slots__ = ("loop", "future", "state")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
        self.loop, self.future, self.state = loop, future, "waiting"


def _grant(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(NetworkError("stopped: the command that started this read was interrupted"))


@dataclass(frozen=True)
class SharedLimits:
    """``limiter``: the shared bound on requests in flight (None: none). ``ends_at``: a ``time.monotonic()``
    value no read may pass (None: each read's own deadline only)."""

    limiter: RequestLimiter | None = None
    ends_at: float | None = None


_CURRENT: ContextVar[SharedLimits | None] = ContextVar("ckptinspect_shared_limits", default=None)


def current_shared_limits() -> SharedLimits | None:
    return _CURRENT.get()


@contextlib.contextmanager
def shared_limits(limits: SharedLimits) -> Iterator[None]:
    token = _CURRENT.set(limits)
    try:
        yield
    finally:
        _CURRENT.reset(token)
