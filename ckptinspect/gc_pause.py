"""Pausing the cyclic garbage collector around work that builds many acyclic containers."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building large acyclic JSON trees or scan records.

    json.loads of a 41 MB index allocates ~1M containers, which triggers many full collections that
    find nothing (measured: ~2x slower header parsing with the collector on). Unlike ``gc.freeze`` it
    leaves nothing behind: the collector runs again, over everything, once the block ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
