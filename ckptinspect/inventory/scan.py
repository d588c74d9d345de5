"""Per-shard scan: parse + validate one header and fold its tensors into pattern groups.

This is the only per-tensor loop of the report path. Names are grouped by their *shape*: the name
with every digit masked (``bytes.translate``, C speed) is the cache key for the pattern and the
character slices of its numeric segments, so the regex runs once per distinct shape, not per
tensor. Large checkpoints are scanned in forked worker processes that return compact ShardScans
(a few thousand group accumulators, not 370k records); for local directories the workers start on
the safetensors files present while the main process parses the index.
"""

from __future__ import annotations

import gc
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from multiprocessing import get_context
from typing import Mapping

from ckptinspect.header.parser import parse_header
from ckptinspect.records import RawCheckpoint
from ckptinspect.sources.interface import LocalHeaders, gc_paused

_NUMERIC_SEGMENT = re.compile(r"\.(\d+)(?=\.|$)")
_MASK_DIGITS = bytes.maketrans(b"0123456789", b"##########")

# Worker processes pay off only with enough header JSON to parse: below this the pool start-up
# (tens of ms) costs more than it saves.
PARALLEL_MIN_HEADER_BYTES = 4_000_000
# MoE shards of a few GB carry 50-700 kB of header each (0.02-0.03% of the data), so file size is a
# usable proxy for header volume before anything is read.
HEADER_TO_DATA_RATIO = 1 / 4000
WORKERS_ENV = "CKPTINSPECT_WORKERS"


@dataclass(frozen=True)
class ShardScan:
    shard: str
    header_length: int
    file_size: int | None
    tensors: int
    data_bytes: int
    # (pattern, first index) -> [count, bytes, elements, dtype, shape, subs, dtypes (set) | None, shapes_vary];
    # subs: the remaining numeric segments per member: [] when there are none, ints when there is one
    # (the usual expert id), tuples when there are several.
    groups: Mapping[tuple[str, int | None], list]
    name_hash: int  # order-independent sum of hash(name): cross-checks the index without shipping names


def _shape_of(name: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """Pattern (numeric segments -> "{}") and the character spans of those segments."""
    spans = tuple((m.start(1), m.end(1)) for m in _NUMERIC_SEGMENT.finditer(name))
    text = _NUMERIC_SEGMENT.split(name)[0::2]
    if "{" in name or "}" in name:
        text = [t.replace("{", "{{").replace("}", "}}") for t in text]
    return ".{}".join(text), spans


def scan_header(shard: str, data: bytes, file_size: int | None) -> ShardScan:
    """Validate one header and aggregate its tensors by (pattern, first index)."""
    with gc_paused():
        return _scan(shard, data, file_size)


def _scan(shard: str, data: bytes, file_size: int | None) -> ShardScan:
    # Runs with the cyclic GC paused (the trees are acyclic; refcounting frees them). The header
    # is released before returning, so re-enabling the collector does not traverse it.
    header = parse_header(data, source=shard, file_size=file_size)
    names, sizes = header.names, header.sizes
    groups: dict[tuple[str, int | None], list] = {}
    for members in _members_by_shape(names):
        pattern, spans = _shape_of(names[members[0]])
        member_names = list(map(names.__getitem__, members))
        if not spans:
            for i in members:
                _add(groups, (pattern, None), [i], header, None)
            continue
        first_at = itemgetter(slice(*spans[0]))
        firsts = list(map(int, map(first_at, member_names)))
        if len(spans) == 1:
            subs = None
        elif len(spans) == 2:
            subs = list(map(int, map(itemgetter(slice(*spans[1])), member_names)))
        else:
            subs = [tuple(int(n[b:e]) for b, e in spans[1:]) for n in member_names]
        if firsts.count(firsts[0]) == len(firsts):
            _add(groups, (pattern, firsts[0]), members, header, subs)
            continue
        by_first = sorted(range(len(members)), key=firsts.__getitem__)
        for first, run in groupby(by_first, key=firsts.__getitem__):
            positions = list(run)
            _add(groups, (pattern, first), list(map(members.__getitem__, positions)), header,
                 None if subs is None else list(map(subs.__getitem__, positions)))
    name_hash = sum(map(hash, names)) & 0xFFFFFFFFFFFFFFFF
    scan = ShardScan(shard, header.length, file_size, len(names), header.data_bytes, groups, name_hash)
    del header
    return scan


def _members_by_shape(names: list[str]) -> list[list[int]]:
    """Indices of the names grouped by digit-masked shape (all C-level: join, translate, sort)."""
    joined = "\n".join(names)
    masked = joined.encode().translate(_MASK_DIGITS).split(b"\n")
    if len(masked) != len(names):  # a name containing a newline: mask one by one
        masked = [n.encode().translate(_MASK_DIGITS) for n in names]
    order = sorted(range(len(names)), key=masked.__getitem__)
    return [list(run) for _, run in groupby(order, key=masked.__getitem__)]


def _add(groups: dict, key: tuple[str, int | None], members: list[int], header, subs: list | None) -> None:
    """Fold tensors ``members`` (indices into the header columns) into group ``key``."""
    dtypes = list(map(header.dtypes.__getitem__, members))
    shapes = list(map(header.shapes.__getitem__, members))
    nbytes = sum(map(header.sizes.__getitem__, members))
    elements = sum(map(header.numels.__getitem__, members))
    mixed = set(dtypes) if dtypes.count(dtypes[0]) != len(dtypes) else None
    varies = shapes.count(shapes[0]) != len(shapes)
    acc = groups.get(key)
    if acc is None:
        groups[key] = [len(members), nbytes, elements, dtypes[0], shapes[0], [] if subs is None else subs,
                       mixed, varies]
        return
    acc[0] += len(members)
    acc[1] += nbytes
    acc[2] += elements
    if subs is not None:
        acc[5].extend(subs)
    if mixed or dtypes[0] != acc[3]:
        acc[6] = (acc[6] or {acc[3]}) | set(dtypes)
    if varies or shapes[0] != acc[4]:
        acc[7] = True


# Set before the pool forks so workers read headers from the inherited source, not from pickles.
_SOURCE: RawCheckpoint | None = None


def _worker_init() -> None:
    # Workers only build acyclic trees and exit afterwards: the cyclic GC is pure overhead there.
    gc.disable()


def _scan_batch(batch: list[tuple[str, int | None]]) -> list[ShardScan]:
    assert _SOURCE is not None
    return [_scan(shard, _SOURCE.headers[shard], size) for shard, size in batch]


def _balanced_batches(sizes: dict[str, int | None], count: int) -> list[list[tuple[str, int | None]]]:
    """Split shards into ``count`` batches of similar total size (largest first, greedy)."""
    batches: list[list[tuple[str, int | None]]] = [[] for _ in range(count)]
    load = [0] * count
    for shard, size in sorted(sizes.items(), key=lambda kv: -(kv[1] or 0)):
        i = load.index(min(load))
        batches[i].append((shard, size))
        load[i] += size or 1
    return [b for b in batches if b]


def scan_all(raw: RawCheckpoint) -> list[ShardScan]:
    """Scan every shard header, in forked worker processes when that pays off."""
    global _SOURCE
    headers = raw.headers
    workers = _worker_count(raw)
    if workers <= 1:
        with gc_paused():
            scans = [_scan(s, headers[s], raw.file_sizes.get(s)) for s in headers]
        gc.freeze()  # the scans live until the report is rendered; never traverse them again
        return scans
    _SOURCE = raw
    # Objects alive now are frozen out of the collector, so forked children never touch (and
    # copy) their pages.
    gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork"),
                                 initializer=_worker_init) as pool:
            # One batch per worker, submitted up front: while the main thread parses the index
            # (one long C call holding the GIL) the pool's feeder thread cannot hand out work.
            if isinstance(headers, LocalHeaders):
                first = dict(headers.candidates)  # files present; the index is parsed meanwhile
            else:
                first = {s: raw.file_sizes.get(s) for s in headers}
            futures = [pool.submit(_scan_batch, batch) for batch in _balanced_batches(first, workers)]
            shards = list(headers)
            late = [s for s in shards if s not in first]
            if late:
                futures.append(pool.submit(_scan_batch, [(s, raw.file_sizes.get(s)) for s in late]))
            with gc_paused():
                done = {scan.shard: scan for future in futures for scan in future.result()}
            return [done[s] for s in shards]
    finally:
        _SOURCE = None


def _worker_count(raw: RawCheckpoint) -> int:
    if os.name != "posix":
        return 1
    configured = os.environ.get(WORKERS_ENV)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if configured:
        return max(1, int(configured))
    headers = raw.headers
    if isinstance(headers, LocalHeaders):
        volume = int(sum(headers.candidates.values()) * HEADER_TO_DATA_RATIO)
        count = len(headers.candidates)
    else:
        volume = sum(len(v) for v in headers.values())
        count = len(headers)
    if volume < PARALLEL_MIN_HEADER_BYTES or count < 2:
        return 1
    return max(1, min(cpus, count, 8))
