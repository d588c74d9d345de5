"""Per-shard scan: parse + validate one header and fold its tensors into pattern groups.

This is the only per-tensor loop of the report path. A group is (pattern, first index): the pattern is
the name with every dot-delimited all-ASCII-digit segment replaced by ``{}``, the first index the value
of the first such segment, and the remaining segments are kept per member (``subs``). To avoid a regex
per tensor, names are first bucketed by their *shape*: the name with every ASCII digit masked
(``bytes.translate``, C speed). Members of one bucket differ only in digits, so their numeric segments
sit at the same places; digits embedded in a word (``w1`` / ``w2`` / ``w3``, ``fc1``, ``proj_1``) also
mask alike, so a bucket is split again by those embedded digits before its pattern is taken from one
member. tests/test_grouping_differential.py holds this to a per-name reference implementation.
``scan_checkpoint`` runs it over every shard of a record, in this thread, in the record's order.

Each header is validated once, by parser.py (its fast path, header/typed.py, takes every real header),
and grouped over the Header's columns; the grouping checks nothing again.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from itertools import groupby
from math import prod
from operator import itemgetter
from typing import Mapping

from ckptinspect.gc_pause import gc_paused
from ckptinspect.header.parser import Header, parse_header
from ckptinspect.progress import SILENT, Progress
from ckptinspect.records import IndexSummary, RawCheckpoint

# A numeric segment is a whole dot-delimited segment written as a canonical decimal: ASCII digits only
# (``\d`` would take other scripts' digits, which the mask leaves alone), no leading zero (so
# ``pattern.format(index, *subs)`` gives back the exact name) and at most 18 digits (an index, never a
# number int() refuses: Python caps int() at 4,300 digits). Anything else is text of the pattern.
_MAX_INDEX_DIGITS = 18
_NUMERIC_SEGMENT = re.compile(r"\.(0|[1-9][0-9]{0,17})(?=\.|$)")
_ALL_DIGIT_SEGMENT = re.compile(r"\.([0-9]+)(?=\.|$)")  # numeric-segment candidates, leading zeros or not
_DIGIT = re.compile(r"[0-9]")
# 0xFF never occurs in UTF-8 (nor in the surrogate-pass encoding), so a masked name cannot collide with
# another name's literal characters: members of one bucket differ in ASCII digits and nothing else.
_MASK_DIGITS = bytes.maketrans(b"0123456789", b"\xff" * 10)
# Layer and expert indices are mostly below 4096: looking their text up costs ~1/3 of int().
_SMALL_DECIMALS = {str(i): i for i in range(4096)}
# Mask -> (pattern, spans, starts of the multi-digit spans) of the buckets whose mask alone decides them
# (_split_by_pattern). Pure values: sharing them between threads and calls is safe; the bound keeps a
# hostile checkpoint from growing it.
_PLAIN_SHAPES: dict[bytes, tuple[str, tuple[tuple[int, int], ...], tuple[int, ...]]] = {}
_PLAIN_SHAPES_MAX = 8192


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
    # Each member's dtype, in ``subs`` order, only when the members' dtypes differ (else None): which
    # member is stored unlike the others decides what an engine that builds one parameter for the whole
    # group does with it (readiness/draft_build.py). Mixed groups are rare, so the usual path pays nothing.
    member_dtypes: list[str] | None = None

    def merged(self, other: "GroupTally") -> "GroupTally":
        """A new tally holding both (self first)."""
        out = GroupTally(self.tensors, self.bytes, self.elements, self.dtype, self.shape, list(self.subs),
                         self.dtypes, self.shapes_vary,
                         None if self.member_dtypes is None else list(self.member_dtypes))
        out.absorb(other.tensors, other.bytes, other.elements, other.dtype, other.shape, other.subs,
                   other.dtypes, other.shapes_vary, other.member_dtypes)
        return out

    def absorb(self, tensors: int, nbytes: int, elements: int, dtype: str, shape: list[int], subs: list,
               dtypes: set[str] | None, shapes_vary: bool, member_dtypes: list[str] | None = None) -> None:
        before = len(self.subs)
        self.tensors += tensors
        self.bytes += nbytes
        self.elements += elements
        self.subs.extend(subs)
        if dtypes or dtype != self.dtype:
            self.dtypes = (self.dtypes or {self.dtype}) | (dtypes or {dtype})
            if self.member_dtypes is None:
                self.member_dtypes = [self.dtype] * before
        if self.member_dtypes is not None:
            self.member_dtypes.extend(member_dtypes if member_dtypes is not None else [dtype] * len(subs))
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


def scan_checkpoint(raw: RawCheckpoint, progress: Progress = SILENT) -> tuple[list[ShardScan], IndexSummary | None]:
    """(one ShardScan per shard in the record's order, the index summary when there is an index).

    One scan for every source: the record is complete and eager (records.RawCheckpoint), so this reads
    ``raw.headers`` and the source's one ``index_summary`` and never asks which kind of source it holds.
    The shards are scanned in the record's order, so the first bad one in that order raises;
    ``progress`` hears "headers n/N" as it goes."""
    scans = []
    headers, sizes = raw.headers, raw.file_sizes
    with gc_paused():  # the scans are acyclic: collections during the loop would find nothing
        try:
            for done, shard in enumerate(headers):
                progress.phase("scanning headers", done, len(headers))
                scans.append(scan_header_unpaused(shard, headers[shard], sizes.get(shard)))
        finally:
            progress.end()
    return scans, raw.index_summary


def _shape_of(name: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """Pattern (numeric segments -> "{}") and the character spans of those segments."""
    spans = tuple((m.start(1), m.end(1)) for m in _NUMERIC_SEGMENT.finditer(name))
    text = _NUMERIC_SEGMENT.split(name)[0::2]
    if "{" in name or "}" in name:
        text = [t.replace("{", "{{").replace("}", "}}") for t in text]
    return ".{}".join(text), spans


def scan_header_unpaused(shard: str, data: bytes, file_size: int | None) -> ShardScan:
    """Validate one header (parse_header) and aggregate its tensors by (pattern, first index).

    Callers pause the cyclic GC around it (gc_pause.gc_paused, as scan_checkpoint does): the trees are
    acyclic and freed by refcounting, and the header is released before returning, so the collector
    never traverses it."""
    return scan_of_header(shard, parse_header(data, source=shard, file_size=file_size), file_size)


def scan_of_header(shard: str, header: Header, file_size: int | None) -> ShardScan:
    """The ShardScan of a validated header: its tensors grouped over the Header's columns."""
    names = header.names
    groups = _group(names, header)
    name_hash = sum(map(hash, names)) & 0xFFFFFFFFFFFFFFFF
    return ShardScan(shard, header.length, file_size, len(names), header.data_bytes, groups, name_hash)


def _group(names: list[str], header: Header) -> dict[tuple[str, int | None], GroupTally]:
    """Tensors folded into (pattern, first index) groups (``_add`` per group of members)."""
    groups: dict[tuple[str, int | None], GroupTally] = {}
    for members, member_names, pattern, spans, joined in _split_by_pattern(names, _members_by_shape(names)):
        if not spans:
            for i in members:
                _add(groups, (pattern, None), [i], header, None)
            continue
        # The first index is usually one layer for the whole bucket: compare its digits column by column
        # (strided slices and counts in C, ~6x less than a slice per name; canonical decimals, so equal
        # strings are equal numbers) before converting any of them.
        width = len(member_names[0])
        joined = "".join(member_names) if joined is None else joined
        same_first = len(members) == 1 or all(column.count(column[0]) == len(column)
                                              for column in (joined[p::width] for p in range(*spans[0])))
        if len(spans) == 1:
            subs = None
        elif len(spans) == 2:
            subs = _decimals(list(map(itemgetter(slice(*spans[1])), member_names)))
        else:
            subs = [tuple(int(n[b:e]) for b, e in spans[1:]) for n in member_names]
        if same_first:
            _add(groups, (pattern, int(member_names[0][slice(*spans[0])])), members, header, subs)
            continue
        firsts = _decimals(list(map(itemgetter(slice(*spans[0])), member_names)))
        by_first = sorted(range(len(members)), key=firsts.__getitem__)
        for first, run in groupby(by_first, key=firsts.__getitem__):
            positions = list(run)
            _add(groups, (pattern, first), list(map(members.__getitem__, positions)), header,
                 None if subs is None else list(map(subs.__getitem__, positions)))
    return groups


def _decimals(texts: list[str]) -> list[int]:
    """int() of each canonical decimal (a table lookup for the usual small ones)."""
    try:
        return list(map(_SMALL_DECIMALS.__getitem__, texts))
    except KeyError:
        return list(map(int, texts))


def _members_by_shape(names: list[str]) -> dict[bytes, list[int]]:
    """Indices of the names grouped by digit-masked shape (masking in C: the names joined by newlines,
    translated and split; the indices are appended by C-level maps)."""
    masked = "\n".join(names).encode("utf-8", "surrogatepass").translate(_MASK_DIGITS).split(b"\n")
    if len(masked) != len(names):  # a name containing a newline: mask one by one
        masked = [n.encode("utf-8", "surrogatepass").translate(_MASK_DIGITS) for n in names]
    buckets: defaultdict[bytes, list[int]] = defaultdict(list)
    any(map(list.append, map(buckets.__getitem__, masked), range(len(masked))))  # append returns None
    return buckets


def _split_by_pattern(names: list[str], buckets: dict[bytes, list[int]]):
    """Yield (member indices, member names, pattern, numeric-segment spans, the names concatenated or
    None) per distinct pattern.

    Members of a shape bucket differ only in ASCII digits, at the same places. They share one pattern
    unless (a) some digits lie outside the all-digit segments (``experts.3.w1`` / ``experts.3.w2``), or
    (b) an all-digit segment has a leading zero in some members (``007`` is text, ``100`` a number), or
    (c) an all-digit segment is longer than an index (19+ digits: text, whatever its digits). These
    are checked with C-speed maps over the bucket; only then is the bucket split, and each part takes
    its pattern and spans from its own first member.

    When every digit of the first member lies in a numeric segment, (a) and (c) cannot hold and the mask
    alone decides the pattern and spans, so they are kept in _PLAIN_SHAPES by mask (the shards of one
    checkpoint share their masks: ~10 us of regex per bucket); (b) is then one look at the first-digit
    column of each multi-digit segment (the members have one length, so every k-th character of their
    concatenation is one column)."""
    for mask, members in buckets.items():
        member_names = list(map(names.__getitem__, members))
        first = member_names[0]
        known = _PLAIN_SHAPES.get(mask)
        if known is not None:
            pattern, spans, wide = known
        else:
            pattern, spans = _shape_of(first)
            wide, digits = (), 0
            for begin, end in spans:
                digits += end - begin
                if end - begin > 1:
                    wide += (begin,)
        if known is not None or mask.count(b"\xff") == digits:
            joined, width = "".join(member_names), len(first)
            if not wide or not any("0" in joined[begin::width] for begin in wide):
                if known is None:
                    if len(_PLAIN_SHAPES) >= _PLAIN_SHAPES_MAX:  # bounded: a hostile header has millions of masks
                        _PLAIN_SHAPES.clear()
                    _PLAIN_SHAPES[mask] = (pattern, spans, wide)
                yield members, member_names, pattern, spans, joined
                continue
            pattern, spans = _shape_of(first)  # a leading zero: the first member's own segments
        if len(members) == 1:
            yield members, member_names, pattern, spans, first
            continue
        candidates = [m.span(1) for m in _ALL_DIGIT_SEGMENT.finditer(first)]
        in_segments = {i for begin, end in candidates for i in range(begin, end)}
        embedded = [m.start() for m in _DIGIT.finditer(first) if m.start() not in in_segments]
        zero_leads = [(begin, end) for begin, end in candidates if 1 < end - begin <= _MAX_INDEX_DIGITS
                      and "0" in set(map(itemgetter(begin), member_names))]
        long_texts = [(begin, end) for begin, end in candidates if end - begin > _MAX_INDEX_DIGITS]
        if not embedded and not zero_leads and not long_texts:
            yield members, member_names, pattern, spans, None
            continue
        if zero_leads or long_texts:
            # a segment with a leading zero, or longer than an index, is text: its digits belong to the pattern
            keys = [(tuple(n[p] for p in embedded), tuple(n[b:e] if n[b] == "0" else "" for b, e in zero_leads),
                     tuple(n[b:e] for b, e in long_texts)) for n in member_names]
        else:
            keys = list(map(itemgetter(*embedded), member_names))
            if keys.count(keys[0]) == len(keys):  # the usual case (weight_scale_2, fc1): one run, C speed
                yield members, member_names, pattern, spans, None
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
            yield run, list(map(names.__getitem__, run)), run_pattern, run_spans, None


def _add(groups: dict, key: tuple[str, int | None], members: list[int], header: Header, subs: list | None) -> None:
    """Fold tensors ``members`` (indices into the header columns) into group ``key``."""
    first = members[0]
    if len(members) == 1:  # a name of its own (norms, embeddings, heads): no list work
        shape = header.shapes[first]
        _fold(groups, key, 1, header.sizes[first], prod(shape), header.dtypes[first], list(shape), subs, None, False)
        return
    dtypes = list(map(header.dtypes.__getitem__, members))
    shapes = list(map(header.shapes.__getitem__, members))
    count = len(members)
    mixed = set(dtypes) if dtypes.count(dtypes[0]) != count else None
    varies = shapes.count(shapes[0]) != count
    if mixed is None and not varies:  # the usual group: one dtype and shape, so one (validated) size
        nbytes, elements = header.sizes[first] * count, prod(shapes[0]) * count
    else:
        nbytes, elements = sum(map(header.sizes.__getitem__, members)), sum(map(prod, shapes))
    _fold(groups, key, count, nbytes, elements, dtypes[0], list(shapes[0]), subs, mixed, varies,
          dtypes if mixed is not None and subs else None)


def _fold(groups: dict, key: tuple[str, int | None], tensors: int, nbytes: int, elements: int, dtype: str,
          shape: list[int], subs: list | None, mixed: set[str] | None, varies: bool,
          member_dtypes: list[str] | None = None) -> None:
    tally = groups.get(key)
    if tally is None:
        groups[key] = GroupTally(tensors, nbytes, elements, dtype, shape, [] if subs is None else subs, mixed, varies,
                                 member_dtypes)
    else:
        tally.absorb(tensors, nbytes, elements, dtype, shape, subs or [], mixed, varies, member_dtypes)
