"""Order-independent fingerprints of a set of tensor names (the index cross-check, header/index.py).

Kept apart from header/index.py so that the scan worker process (inventory/scan_worker.py) imports only
the scan modules, not the records.
"""

from __future__ import annotations

import zlib
from operator import methodcaller
from typing import Iterable

HASH_MASK = 0xFFFFFFFFFFFFFFFF
_UTF8_SURROGATES = methodcaller("encode", "utf-8", "surrogatepass")


def seeded_fingerprint(names: Iterable[str]) -> int:
    """The sum of ``hash(name)``, mod 2**64.

    The cheapest (a string caches its hash), but ``hash(str)`` is seeded per process: comparable only
    with fingerprints made in this process. The default of the index summary and of the scan."""
    return sum(map(hash, names)) & HASH_MASK


def name_fingerprint(names: Iterable[str]) -> int:
    """The sum of the names' CRC-32s, mod 2**64.

    The same in every process: what a scan run in the worker process (inventory/parallel.py) is compared
    with. ~0.05 CPU-s more than ``seeded_fingerprint`` for 371k names, so it is used only there."""
    names = names if isinstance(names, list) else list(names)
    try:
        return sum(map(zlib.crc32, map(str.encode, names))) & HASH_MASK
    except UnicodeEncodeError:  # a lone surrogate (kept by the exact JSON path): encode it as it is
        return sum(map(zlib.crc32, map(_UTF8_SURROGATES, names))) & HASH_MASK
