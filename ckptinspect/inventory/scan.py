"""Per-shard scan: parse + validate one header and fold its tensors into pattern groups.

This is the only per-tensor loop of the report path. A group is (pattern, first index): the pattern is
the name with every dot-delimited all-ASCII-digit segment replaced by ``{}``, the first index the value
of the first such segment, and the remaining segments are kept per member (``subs``). To avoid a regex
per tensor, names are first bucketed by their *shape*: the name with every ASCII digit masked
(``bytes.translate``, C speed). Members of one bucket differ only in digits, so their numeric segments
sit at the same places; digits embedded in a word (``w1`` / ``w2`` / ``w3``, ``fc1``, ``proj_1``) also
mask alike, so a bucket is split again by those embedded digits before its pattern is taken from one
member. tests/test_grouping_differential.py holds this to a per-name reference implementation.
inventory/parallel.py runs it over all shards (in worker processes for large checkpoints).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Mapping

from ckptinspect.header.parser import parse_header

# A numeric segment is a whole dot-delimited segment written as a canonical decimal: ASCII digits only
# (``\d`` would take other scripts' digits, which the mask leaves alone), no leading zero (so
# ``pattern.format(index, *subs)`` gives back the exact name) and at most 18 digits (an index, never a
# number int() refuses: Python caps int() at 4,300 digits). Anything else is text of the pattern.
_MAX_INDEX_DIGITS = 18
_NUMERIC_SEGMENT = re.compile(r"\.(0|[1-9][0-9]{0,17})(?=\.|$)")
_ALL_DIGIT_SEGMENT = re.compile(r"\.([0-9]+)(?=\.|$)")  # numeric-segment candidates, leading zeros or not
_DIGIT = re.compile(r"[0-9]")
_LEADING_ZERO = re.compile(r"\.0[0-9]")
# 0xFF never occurs in UTF-8 (nor in the surrogate-pass encoding), so a masked name cannot collide with
# another name's literal characters: members of one bucket differ in ASCII digits and nothing else.
_MASK_DIGITS = bytes.maketrans(b"0123456789", b"\xff" * 10)


@dataclass(slots=True)
class GroupTally:
    """Running totals of one (pattern, first index) group of tensors.

    The scan fills one per group and shard; the inventory builder merges copies across shards
    (``merged``), never the scan's own, so a ShardScan stays as the scan left it."""

    tensors: int
    bytes: int
    elements: int
    dtype: str  # dtype of the first member
    shape: list[int]  # shape of the first member
    # Remaining numeric segments per member: [] when there are none, ints when there is one (the usual
    # expert id), tuples when there are several.
    subs: list
    dtypes: set[str] | None  # every dtype when the members differ, else None
    shapes_vary: bool

    def merged(self, other: "GroupTally") -> "GroupTally":
        """A new tally holding both (self first)."""
        out = GroupTally(self.tensors, self.bytes, self.elements, self.dtype, self.shape, list(self.subs),
                         self.dtypes, self.shapes_vary)
        out.absorb(other.tensors, other.bytes, other.elements, other.dtype, other.shape, other.subs,
                   other.dtypes, other.shapes_vary)
        return out

    def absorb(self, tensors: int, nbytes: int, elements: int, dtype: str, shape: list[int], subs: list,
               dtypes: set[str] | None, shapes_vary: bool) -> None:
        self.tensors += tensors
        self.bytes += nbytes
        self.elements += elements
        self.subs.extend(subs)
        if dtypes or dtype != self.dtype:
            self.dtypes = (self.dtypes or {self.dtype}) | (dtypes or {dtype})
        if shapes_vary or shape != self.shape:
            self.shapes_vary = True


@dataclass(frozen=True)
class ShardScan:
    shard: str
    header_length: int
    file_size: int | None
    tensors: int
    data_bytes: int
    groups: Mapping[tuple[str, int | None], GroupTally]  # (pattern, first index) -> tally
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
    joined = "\n".join(names)
    # Segments with a leading zero are rare; one C-speed search spares the per-bucket check without them.
    zeros = _LEADING_ZERO.search(joined) is not None
    for members, member_names, pattern, spans in _split_by_pattern(names, _members_by_shape(names, joined), zeros):
        if not spans:
            for i in members:
                _add(groups, (pattern, None), [i], header, None)
            continue
        # The first index is usually one layer for the whole bucket: compare the digit strings (C speed;
        # canonical decimals, so equal strings are equal numbers) before converting any of them.
        first_texts = list(map(itemgetter(slice(*spans[0])), member_names))
        same_first = first_texts.count(first_texts[0]) == len(first_texts)
        if len(spans) == 1:
            subs = None
        elif len(spans) == 2:
            subs = list(map(int, map(itemgetter(slice(*spans[1])), member_names)))
        else:
            subs = [tuple(int(n[b:e]) for b, e in spans[1:]) for n in member_names]
        if same_first:
            _add(groups, (pattern, int(first_texts[0])), members, header, subs)
            continue
        firsts = list(map(int, first_texts))
        by_first = sorted(range(len(members)), key=firsts.__getitem__)
        for first, run in groupby(by_first, key=firsts.__getitem__):
            positions = list(run)
            _add(groups, (pattern, first), list(map(members.__getitem__, positions)), header,
                 None if subs is None else list(map(subs.__getitem__, positions)))
    name_hash = sum(map(hash, names)) & 0xFFFFFFFFFFFFFFFF
    scan = ShardScan(shard, header.length, file_size, len(names), header.data_bytes, groups, name_hash)
    del header
    return scan


def _members_by_shape(names: list[str], joined: str) -> list[list[int]]:
    """Indices of the names grouped by digit-masked shape (masking in C: ``joined`` is the names joined
    by newlines, translated and split)."""
    masked = joined.encode("utf-8", "surrogatepass").translate(_MASK_DIGITS).split(b"\n")
    if len(masked) != len(names):  # a name containing a newline: mask one by one
        masked = [n.encode("utf-8", "surrogatepass").translate(_MASK_DIGITS) for n in names]
    buckets: dict[bytes, list[int]] = {}
    for i, key in enumerate(masked):
        bucket = buckets.get(key)
        if bucket is None:
            buckets[key] = [i]
        else:
            bucket.append(i)
    return list(buckets.values())


def _split_by_pattern(names: list[str], buckets: list[list[int]], zeros: bool):
    """Yield (member indices, member names, pattern, numeric-segment spans) per distinct pattern.

    Members of a shape bucket differ only in ASCII digits, at the same places. They share one pattern
    unless (a) some digits lie outside the all-digit segments (``experts.3.w1`` / ``experts.3.w2``), or
    (b) an all-digit segment has a leading zero in some members (``007`` is text, ``100`` a number). Both
    are checked with C-speed maps over the bucket (``zeros`` False: no name has a leading-zero segment);
    only then is the bucket split, and each part takes its pattern and spans from its own first member."""
    for members in buckets:
        first = names[members[0]]
        pattern, spans = _shape_of(first)
        member_names = list(map(names.__getitem__, members))
        if len(members) == 1:
            yield members, member_names, pattern, spans
            continue
        candidates = [m.span(1) for m in _ALL_DIGIT_SEGMENT.finditer(first)]
        in_segments = {i for begin, end in candidates for i in range(begin, end)}
        embedded = [m.start() for m in _DIGIT.finditer(first) if m.start() not in in_segments]
        zero_leads = [(begin, end) for begin, end in candidates if zeros and 1 < end - begin <= _MAX_INDEX_DIGITS
                      and "0" in set(map(itemgetter(begin), member_names))]
        if not embedded and not zero_leads:
            yield members, member_names, pattern, spans
            continue
        if zero_leads:
            # a segment with a leading zero is text: all its digits belong to the pattern
            keys = [(tuple(n[p] for p in embedded), tuple(n[b:e] if n[b] == "0" else "" for b, e in zero_leads))
                    for n in member_names]
        else:
            keys = list(map(itemgetter(*embedded), member_names))
            if keys.count(keys[0]) == len(keys):  # the usual case (weight_scale_2, fc1): one run, C speed
                yield members, member_names, pattern, spans
                continue
        runs: dict[object, list[int]] = {}
        for i, key in zip(members, keys):
            run = runs.get(key)
            if run is None:
                runs[key] = [i]
            else:
                run.append(i)
        for run in runs.values():
            run_pattern, run_spans = _shape_of(names[run[0]])
            yield run, list(map(names.__getitem__, run)), run_pattern, run_spans


def _add(groups: dict, key: tuple[str, int | None], members: list[int], header, subs: list | None) -> None:
    """Fold tensors ``members`` (indices into the header columns) into group ``key``."""
    dtypes = list(map(header.dtypes.__getitem__, members))
    shapes = list(map(header.shapes.__getitem__, members))
    nbytes = sum(map(header.sizes.__getitem__, members))
    elements = sum(map(header.numels.__getitem__, members))
    mixed = set(dtypes) if dtypes.count(dtypes[0]) != len(dtypes) else None
    varies = shapes.count(shapes[0]) != len(shapes)
    tally = groups.get(key)
    if tally is None:
        groups[key] = GroupTally(len(members), nbytes, elements, dtypes[0], shapes[0],
                                 [] if subs is None else subs, mixed, varies)
    else:
        tally.absorb(len(members), nbytes, elements, dtypes[0], shapes[0], subs or [], mixed, varies)
