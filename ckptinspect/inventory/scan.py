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

Plain headers are read by header/typed.py (one compiled decode) and their sizes checked here per group;
any other header by parser.py. tests/test_scan_fast.py holds the two paths to one answer.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from itertools import accumulate, groupby, repeat
from math import prod
from operator import attrgetter, itemgetter, mul, sub
from typing import Mapping

from ckptinspect.gc_pause import gc_paused
from ckptinspect.header.parser import (DTYPE_BITS, MAX_DATA_BYTES, PREFIX_BYTES, parse_header,
                                       zero_shape_fits)
from ckptinspect.header.typed import decode_plain
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
_OFFSETS, _DTYPE, _SHAPE = attrgetter("data_offsets"), attrgetter("dtype"), attrgetter("shape")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
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
    """Validate one header and aggregate its tensors by (pattern, first index).

    Callers pause the cyclic GC around it (gc_pause.gc_paused, as scan_checkpoint does): the trees are acyclic and freed
    by refcounting, and the header is released before returning, so the collector never traverses it.

    Plain headers (every real one) take the typed path: one compiled decode (header/typed.py), then
    the size checks per group, where members usually share dtype and shape, so one comparison in C
    covers a whole group. Whatever that path cannot prove goes through parser.py and the grouping
    over its columns, which decide and explain: the answers are the same (tests/test_scan_fast.py)."""
    entries = decode_plain(data)
    if entries is not None:
        scan = _scan_typed(shard, data, file_size, entries)
        if scan is not None:
            return scan
    return _scan_parsed(shard, data, file_size)


def _scan_parsed(shard: str, data: bytes, file_size: int | None) -> ShardScan:
    """The scan through parser.py (which raises the HeaderError) and the grouping over its columns."""
    header = parse_header(data, source=shard, file_size=file_size)
    names = header.names
    groups = _group(names, _add, header)
    assert groups is not None  # _add never refuses: parse_header has validated every entry
    name_hash = sum(map(hash, names)) & 0xFFFFFFFFFFFFFFFF
    scan = ShardScan(shard, header.length, file_size, len(names), header.data_bytes, groups, name_hash)
    del header
    return scan


def _scan_typed(shard: str, data: bytes, file_size: int | None, entries: dict) -> ShardScan | None:
    """The scan of a typed-decoded header, or None when some check fails (parser.py then explains).

    The checks are parser.py's, in another order: the data buffer tiled from 0 (which bounds every
    offset, so every size, by 2**61), the file size, then per group numel * bits == size * 8 and the
    zero-element overflow rule (tally_checked)."""
    names = list(entries)
    infos = list(entries.values())
    offsets = list(map(_OFFSETS, infos))
    begins = list(map(_FIRST, offsets))
    sizes = list(map(sub, map(_SECOND, offsets), begins))
    position = _tiled_end(begins, sizes)
    if (position is None or position > MAX_DATA_BYTES
            or (file_size is not None and PREFIX_BYTES + len(data) + position != file_size)):
        return None
    groups = _group(names, tally_checked, (infos, sizes))
    if groups is None:
        return None
    name_hash = sum(map(hash, names)) & 0xFFFFFFFFFFFFFFFF
    return ShardScan(shard, len(data), file_size, len(names), position, groups, name_hash)


def _tiled_end(begins: list[int], sizes: list[int]) -> int | None:
    """End of the data buffer when the tensors tile it from 0 without holes or overlaps (in entry order,
    as the safetensors library writes them, or by begin), else None (parser.py's full sort decides).
    A negative size is not refused here: every size is compared with its tensor's shape afterwards."""
    starts = list(accumulate(sizes, initial=0))
    end = starts.pop()
    if starts == begins:
        return end
    order = sorted(range(len(begins)), key=begins.__getitem__)
    starts = list(accumulate(map(sizes.__getitem__, order), initial=0))
    end = starts.pop()
    return end if starts == list(map(begins.__getitem__, order)) else None


def _group(names: list[str], tally, columns) -> dict[tuple[str, int | None], GroupTally] | None:
    """Tensors folded into (pattern, first index) groups by ``tally(groups, key, members, columns,
    subs)``; None as soon as ``tally`` refuses a group (returns False)."""
    groups: dict[tuple[str, int | None], GroupTally] = {}
    for members, member_names, pattern, spans, joined in _split_by_pattern(names, _members_by_shape(names)):
        if not spans:
            for i in members:
                if not tally(groups, (pattern, None), [i], columns, None):
                    return None
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
            if not tally(groups, (pattern, int(member_names[0][slice(*spans[0])])), members, columns, subs):
                return None
            continue
        firsts = _decimals(list(map(itemgetter(slice(*spans[0])), member_names)))
        by_first = sorted(range(len(members)), key=firsts.__getitem__)
        for first, run in groupby(by_first, key=firsts.__getitem__):
            positions = list(run)
            if not tally(groups, (pattern, first), list(map(members.__getitem__, positions)), columns,
                         None if subs is None else list(map(subs.__getitem__, positions))):
                return None
    return groups


def _decimals(texts: list[str]) -> list[int]:
    """int() of each canonical decimal; a table lookup for the usual small ones (~3x less CPU)."""
    try:
        return list(map(_SMALL_DECIMALS.__getitem__, texts))
    except KeyError:
        return list(map(int, texts))


def _members_by_shape(names: list[str]) -> dict[bytes, list[int]]:
    """Indices of the names grouped by digit-masked shape (masking in C: the names joined by newlines,
    translated and split; the indices are appended by C-level maps, ~3x faster than a loop)."""
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


def _add(groups: dict, key: tuple[str, int | None], members: list[int], header, subs: list | None) -> bool:
    """Fold tensors ``members`` (indices into the header columns) into group ``key``."""
    dtypes = list(map(header.dtypes.__getitem__, members))
    shapes = list(map(header.shapes.__getitem__, members))
    nbytes = sum(map(header.sizes.__getitem__, members))
    elements = sum(map(header.numels.__getitem__, members))
    mixed = set(dtypes) if dtypes.count(dtypes[0]) != len(dtypes) else None
    varies = shapes.count(shapes[0]) != len(shapes)
    _fold(groups, key, len(members), nbytes, elements, dtypes[0], shapes[0], subs, mixed, varies)
    return True


def tally_checked(groups: dict, key: tuple[str, int | None], members: list[int], columns: tuple, subs: list | None) -> bool:
    """Check tensors ``members`` of a typed-decoded header as parser.py does and fold them into group
    ``key``; False (nothing folded) when one fails: numel * bits != size * 8, or a zero-element shape
    whose dims overflow 64 bits as the reference multiplies them. ``columns``: (entries, sizes)."""
    entries, sizes = columns
    if len(members) == 1:  # a name of its own (norms, embeddings, heads): no list work
        entry, size = entries[members[0]], sizes[members[0]]
        numel = prod(entry.shape)
        bits = numel * DTYPE_BITS[entry.dtype]
        if bits != size * 8 or (numel == 0 and not zero_shape_fits(entry.shape)):
            return False
        _fold(groups, key, 1, size, numel, entry.dtype, list(entry.shape), subs, None, False)
        return True
    chosen = list(map(entries.__getitem__, members))
    dtypes = list(map(_DTYPE, chosen))
    shapes = list(map(_SHAPE, chosen))
    member_sizes = list(map(sizes.__getitem__, members))
    count = len(members)
    dtype, shape = dtypes[0], shapes[0]
    mixed = set(dtypes) if dtypes.count(dtype) != count else None
    varies = shapes.count(shape) != count
    if mixed is None and not varies:  # the usual group: one expected size, one count in C
        numel = prod(shape)
        bits = numel * DTYPE_BITS[dtype]
        if bits % 8 or member_sizes.count(bits // 8) != count or (numel == 0 and not zero_shape_fits(shape)):
            return False
        nbytes, elements = bits // 8 * count, numel * count
    else:
        numels = list(map(prod, shapes))
        if (list(map(mul, numels, map(DTYPE_BITS.__getitem__, dtypes))) != list(map(mul, member_sizes, repeat(8)))
                or (0 in numels and not all(zero_shape_fits(s) for s, n in zip(shapes, numels) if n == 0))):
            return False
        nbytes, elements = sum(member_sizes), sum(numels)
    _fold(groups, key, count, nbytes, elements, dtype, list(shape), subs, mixed, varies)
    return True


def _fold(groups: dict, key: tuple[str, int | None], tensors: int, nbytes: int, elements: int, dtype: str,
          shape: list[int], subs: list | None, mixed: set[str] | None, varies: bool) -> None:
    tally = groups.get(key)
    if tally is None:
        groups[key] = GroupTally(tensors, nbytes, elements, dtype, shape, [] if subs is None else subs, mixed, varies)
    else:
        tally.absorb(tensors, nbytes, elements, dtype, shape, subs or [], mixed, varies)
