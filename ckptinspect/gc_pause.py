"""Pausing the cyclic garbage collector around work that builds many acyclic containers."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building large acyclic JSON trees or scan records.

    Decoding a large index or scanning headers allocates millions of acyclic containers, which would
    trigger full collections that find nothing (what that costs: BENCHMARKS.md). Unlike ``gc.freeze`` it
    leaves nothing behind: the collector runs again, over everything, once the block ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
