"""The synchronous edge of the asynchronous network client: ``run_sync(make)`` runs the coroutine
``make()`` to its end and returns its answer, for callers that are not coroutines (``report``, the
probe's engine client, the audit's listing).

Where the calling thread runs no event loop (the CLI, a script), the coroutine runs on a fresh loop in
this very thread (``asyncio.run``): Ctrl-C cancels it and raises KeyboardInterrupt here at once. Where
the calling thread already runs a loop (a notebook, an async program calling the sync API), a second loop
cannot run in it, so the coroutine runs on its own loop in one helper thread, named ``ckptinspect-net``,
that ends with it: the only thread a read ever starts besides those ``asyncio.to_thread`` lends it for
file I/O. Async programs can await the readers directly instead (``sources.hub.read_hub``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_loop = False
    else:
        in_loop = True
    box: dict[str, Any] = {}
    if not in_loop:  # outside the except block: its RuntimeError must not become every error's context
        asyncio.run(_into(box, make))
        return box["value"]
    out: dict[str, Any] = {}

    def main() -> None:
        try:
            asyncio.run(_into(box, make))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=main, name="ckptinspect-net", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return box["value"]


async def _into(box: dict[str, Any], make: Callable[[], Awaitable[T]]) -> None:
    """The answer goes into ``box``, not into the task's result: asyncio.Runner.run checks its SIGINT
    handler with ``signal.getsignal``, which formats the handler (a partial holding the main task) with
    ``%r`` on 3.11, and a task's repr shows its result: a report's 50 MB of headers took seconds."""
    box["value"] = await make()
