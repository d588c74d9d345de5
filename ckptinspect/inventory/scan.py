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
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
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
    # (pattern, first index) -> [count, bytes, elements, dtype, shape, subs, dtypes (set) | None, shapes_vary]
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
        header = parse_header(data, source=shard, file_size=file_size)
        groups: dict[tuple[str, int | None], list] = {}
        shapes: dict[bytes, tuple[str, tuple[tuple[int, int], ...]]] = {}
        for name, dtype, shape, size, numel in zip(header.names, header.dtypes, header.shapes, header.sizes,
                                                   header.numels):
            masked = name.encode().translate(_MASK_DIGITS)
            shape_of = shapes.get(masked)
            if shape_of is None:
                shape_of = shapes[masked] = _shape_of(name)
            pattern, spans = shape_of
            if not spans:
                key: tuple[str, int | None] = (pattern, None)
                sub: tuple[int, ...] = ()
            else:
                a, z = spans[0]
                key = (pattern, int(name[a:z]))
                if len(spans) == 1:
                    sub = ()
                elif len(spans) == 2:
                    b, e = spans[1]
                    sub = (int(name[b:e]),)
                else:
                    sub = tuple(int(name[b:e]) for b, e in spans[1:])
            acc = groups.get(key)
            if acc is None:
                groups[key] = [1, size, numel, dtype, shape, [sub], None, False]
                continue
            acc[0] += 1
            acc[1] += size
            acc[2] += numel
            acc[5].append(sub)
            if dtype != acc[3]:
                acc[6] = (acc[6] or {acc[3]}) | {dtype}
            if not acc[7] and shape != acc[4]:
                acc[7] = True
        name_hash = sum(map(hash, header.names)) & 0xFFFFFFFFFFFFFFFF
    return ShardScan(shard, header.length, file_size, len(header.entries), header.data_bytes, groups, name_hash)


# Set before the pool forks so workers read headers from the inherited source, not from pickles.
_SOURCE: RawCheckpoint | None = None


def _scan_in_worker(shard: str, file_size: int | None) -> ShardScan:
    assert _SOURCE is not None
    return scan_header(shard, _SOURCE.headers[shard], file_size)


def scan_all(raw: RawCheckpoint) -> list[ShardScan]:
    """Scan every shard header, in forked worker processes when that pays off."""
    global _SOURCE
    headers = raw.headers
    local = isinstance(headers, LocalHeaders)
    workers = _worker_count(raw)
    if workers <= 1:
        return [scan_header(s, headers[s], raw.file_sizes.get(s)) for s in headers]
    _SOURCE = raw
    # Objects alive now (e.g. an already parsed index) are frozen out of the collector, so forked
    # children never touch (and copy) their pages.
    gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
            futures: dict[str, Future] = {}
            if local:
                # Start on the files present; the index is parsed meanwhile (headers.shards).
                for shard, size in sorted(headers.candidates.items(), key=lambda kv: -kv[1]):
                    futures[shard] = pool.submit(_scan_in_worker, shard, size)
            shards = list(headers)
            for shard in shards:
                if shard not in futures:
                    futures[shard] = pool.submit(_scan_in_worker, shard, raw.file_sizes.get(shard))
            wanted = set(shards)
            for shard, future in futures.items():
                if shard not in wanted:
                    future.cancel()
            return [futures[s].result() for s in shards]
    finally:
        _SOURCE = None
        gc.unfreeze()


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
