"""Per-shard scan: parse + validate one header and fold its tensors into pattern groups.

This is the only per-tensor loop of the report path. Names are grouped by their *shape*: the name
with every digit masked (``bytes.translate``, C speed) is the cache key for the pattern and the
character slices of its numeric segments, so the regex runs once per distinct shape, not per
tensor. inventory/parallel.py runs it over all shards (in worker processes for large checkpoints).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Mapping

from ckptinspect.header.parser import parse_header

_NUMERIC_SEGMENT = re.compile(r"\.(\d+)(?=\.|$)")
_MASK_DIGITS = bytes.maketrans(b"0123456789", b"##########")



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


def scan_header_unpaused(shard: str, data: bytes, file_size: int | None) -> ShardScan:
    """Validate one header and aggregate its tensors by (pattern, first index).

    Callers pause the cyclic GC around it (sources.interface.gc_paused): the trees are acyclic and freed
    by refcounting, and the header is released before returning, so the collector never traverses it."""
    header = parse_header(data, source=shard, file_size=file_size)
    names = header.names
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
    """Indices of the names grouped by digit-masked shape (masking in C: join, translate, split)."""
    masked = "\n".join(names).encode().translate(_MASK_DIGITS).split(b"\n")
    if len(masked) != len(names):  # a name containing a newline: mask one by one
        masked = [n.encode().translate(_MASK_DIGITS) for n in names]
    buckets: dict[bytes, list[int]] = {}
    for i, key in enumerate(masked):
        bucket = buckets.get(key)
        if bucket is None:
            buckets[key] = [i]
        else:
            bucket.append(i)
    return list(buckets.values())


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
