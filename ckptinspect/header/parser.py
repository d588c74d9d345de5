"""Bounded, validating safetensors header parser (a pure function over bytes).

File layout: ``[0:8)`` little-endian u64 N, ``[8:8+N)`` UTF-8 JSON object (space padded), then the
data buffer that every ``data_offsets`` pair is relative to. The checks mirror the reference
implementation's ``Metadata::validate`` (huggingface/safetensors, safetensors/src/tensor.rs): known
dtype, ``numel * bits == 8 * (end - begin)``, offsets contiguous from 0 without holes or overlaps, and
``8 + N + last_end == file size`` when the size is known. Sizes always come from ``data_offsets``,
never from a dtype table, so packed formats (U8 nibble pairs, F4, E8M0) stay exact.

The JSON itself is read with the reference's rules (serde_json: no NaN, no repeated fields, no lone
surrogates, ...): a fast path proves plain ``json.loads`` gives the same answer, everything else goes
through header/exact.py. tests/test_conformance.py checks the accept / reject answers against the
``safetensors`` library; docs/header_conformance.md lists the two deliberate differences.
"""

from __future__ import annotations

import json
import math
import struct
from math import prod
from operator import add
from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import HeaderError

try:
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - a dependency; json gives the same answers, slower
    _loads = None
from ckptinspect.header.exact import U64_MAX, decode_exact

# Bits per element of every dtype string the safetensors format defines (safetensors/src/tensor.rs
# `enum Dtype`). Sub-byte types (F4, F6_*) are legal as long as the tensor's bit count is a whole
# number of bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# The reference reader refuses headers above 100,000,000 bytes (MAX_HEADER_SIZE in tensor.rs).
MAX_HEADER_LENGTH = 100_000_000
PREFIX_BYTES = 8
# Every tensor's bit count (numel * bits) must fit in 64 bits, as in the reference's checked
# multiplication; bounding the end of the data buffer by 2**64 / 8 bounds all of them at once.
MAX_DATA_BYTES = U64_MAX // 8
_ABSENT = object()
# Real tensors have at most 5 dims; longer shapes are validated by the exact path (exact.py).
MAX_FAST_DIMS = 8


@dataclass(frozen=True)
class Header:
    """A validated header. ``entries`` maps tensor name -> {"dtype", "shape", "data_offsets"}."""

    length: int  # N
    entries: Mapping[str, Mapping[str, Any]]  # name -> {"dtype", "shape", "data_offsets"}
    # Columns in entry order, so consumers iterate once without re-reading the dicts.
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    sizes: list[int]  # bytes (end - begin)
    numels: list[int]  # element count (scalars count 1)
    metadata: Mapping[str, str]
    data_bytes: int  # end of the last tensor


def read_length_prefix(prefix: bytes, *, source: str, file_size: int | None = None,
                       max_length: int = MAX_HEADER_LENGTH) -> int:
    """Decode and bound-check the 8-byte header length N.

    Raises:
        HeaderError: the prefix is short, N < 2, N above ``max_length``, or 8 + N beyond the file.
    """
    if len(prefix) < PREFIX_BYTES:
        raise HeaderError(f"file is {len(prefix)} bytes, shorter than the 8-byte header length prefix",
                          path=source)
    (length,) = struct.unpack("<Q", prefix[:PREFIX_BYTES])
    if length < 2:
        raise HeaderError(f"header length {length} is too small for a JSON object", path=source)
    if length > max_length:
        raise HeaderError(f"header length {length:,} exceeds the cap of {max_length:,} bytes", path=source)
    if file_size is not None and PREFIX_BYTES + length > file_size:
        raise HeaderError(f"header length {length:,} runs past the end of the {file_size:,}-byte file",
                          path=source)
    return length


def parse_header(data: bytes, *, source: str, file_size: int | None = None) -> Header:
    """Parse and validate the JSON header bytes ``data`` (the N bytes after the prefix).

    Accepts exactly what the reference reader accepts (tests/test_conformance.py compares the two on a
    generated corpus), except duplicate tensor names and non-object entries, which are refused.

    Args:
        data: exactly the header bytes (trailing spaces allowed).
        source: file name used in error messages.
        file_size: total file size, when known, to check the data buffer is covered exactly.

    Returns:
        The validated Header.

    Raises:
        HeaderError: invalid UTF-8 / JSON, duplicate names or fields, unknown dtype, bad shape or
        offsets, a size mismatch, holes or overlaps, or a data buffer that does not end at the file end.
    """
    length = len(data)
    fast = _fast_path(data)
    if fast is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HeaderError(f"header is not valid UTF-8 (byte {exc.start})", path=source) from None
        obj, metadata = decode_exact(text, source=source)
        columns = _columns(obj)
        if columns is None:
            _raise_first_invalid(obj, source)  # always raises
    else:
        obj, metadata, columns = fast
    names = list(obj)
    dtypes, shapes, sizes, numels, begins = columns  # type: ignore[misc]

    # Contiguity: sorted by (begin, end) as the reference does (an empty tensor may share its start
    # with the next one), each tensor begins where the previous one ended (compared as whole lists,
    # in C). The safetensors library writes entries in offset order, so the entry order is tried
    # first: a chain from 0 in any order tiles the buffer exactly, which is what the sorted check
    # proves, and it spares the sort (~0.1 CPU-s on 371k tensors). Otherwise sorting by begin alone
    # is cheaper and stable; the (begin, end) order is needed only when that comparison fails too.
    starts = begins
    ends = list(map(add, begins, sizes))
    if starts and (starts[0] != 0 or starts[1:] != ends[:-1]):
        order = sorted(range(len(begins)), key=begins.__getitem__)
        starts = list(map(begins.__getitem__, order))
        ends = list(map(add, starts, map(sizes.__getitem__, order)))
    if starts and (starts[0] != 0 or starts[1:] != ends[:-1]):
        order = sorted(range(len(begins)), key=lambda i: (begins[i], sizes[i]))
        starts = list(map(begins.__getitem__, order))
        ends = list(map(add, starts, map(sizes.__getitem__, order)))
        if starts[0] != 0 or starts[1:] != ends[:-1]:
            _raise_contiguity(names, order, starts, ends, source)
    position = ends[-1] if ends else 0
    if position > MAX_DATA_BYTES:
        raise HeaderError(f"data_offsets end at {position:,}, beyond what 64-bit sizes can address",
                          path=source)
    if file_size is not None and PREFIX_BYTES + length + position != file_size:
        raise HeaderError(
            f"data ends at byte {PREFIX_BYTES + length + position:,} but the file has {file_size:,} bytes"
            " (truncated or trailing data)", path=source)
    return Header(length=length, entries=obj, names=names, dtypes=dtypes, shapes=shapes, sizes=sizes,
                  numels=numels, metadata=metadata, data_bytes=position)


def _fast_path(data: bytes) -> tuple[dict, dict, tuple] | None:
    """(entries, metadata, columns) when plain ``json.loads`` provably gives the reference's answer, else None.

    Plain decoding differs from the reference only through escapes (escaped keys, surrogates), ``-0``,
    bools in shapes (they multiply as 1 / 0), repeated keys (collapsed) and unknown fields (which may
    hold NaN, deep nesting, ...); any other negative number fails validation anyway, as do floats,
    nulls and bools outside shapes. A header without a backslash or a ``-0``, whose shapes hold no
    bool, whose entries all have exactly the three fields, and whose ``:`` count equals the number of
    key/value pairs decoded (so no key was repeated, and no string holds a ``:``) has none of them.
    The byte scans run at C speed; parse_header's CPU time on the 371k-tensor replica is ~1.04x that
    of the parser before these checks (interleaved per shard, benchmarks in docs/header_conformance.md).
    Real headers take this path. The checks read the bytes, not a decoded copy: orjson refuses invalid
    UTF-8 exactly as Python's decoder does (tests/test_json_decoders.py), and the exact path decodes.
    """
    try:
        # orjson where installed (~1.5x less CPU): it differs from json only on what the checks below
        # and _columns send to the exact decoder anyway (integers past 64 bits become floats, which
        # fail the int checks; NaN, surrogates, invalid UTF-8 and deep nesting are refused).
        obj = _loads(data) if _loads is not None else json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # malformed, invalid UTF-8, NaN: the exact decoder explains
        return None
    if type(obj) is not dict or b"\\" in data or (b"-" in data and b"-0" in data):
        return None
    metadata = obj.pop("__metadata__", _ABSENT)
    if metadata is _ABSENT:
        pairs, metadata = 0, {}
    elif metadata is None:
        pairs, metadata = 1, {}
    elif type(metadata) is dict and all(type(v) is str for v in metadata.values()):
        pairs = 1 + len(metadata)
    else:
        return None
    if data.count(b":") != pairs + 4 * len(obj):  # bytes.count: ~2x str.count's speed
        return None
    columns = _columns(obj, fields=3)
    if columns is None:
        return None
    return obj, metadata, columns


def _columns(obj: dict, fields: int | None = None) -> tuple[list, list, list, list, list] | None:
    """Validated columns (dtypes, shapes, sizes, numels, begins), or None when any entry is invalid.

    One tight pass (~0.45 us per tensor); the caller re-walks the entries only to explain a failure.
    A single negative dim makes numel negative and fails the size check; two or more could cancel
    out, hence min() for multi-dim shapes. A zero-element tensor gets the reference's dimension-wise
    overflow check (its product alone proves nothing); any other tensor's dims are bounded by its
    byte size, which the caller bounds. ``fields``: the exact number of keys each entry must have.
    """
    bits_of = DTYPE_BITS.get
    dtypes: list[str] = []
    shapes: list[list[int]] = []
    sizes: list[int] = []
    numels: list[int] = []
    begins: list[int] = []
    add_dtype, add_shape, add_size, add_numel, add_begin = (
        dtypes.append, shapes.append, sizes.append, numels.append, begins.append)
    try:
        for info in obj.values():
            dtype = info["dtype"]
            shape = info["shape"]
            begin, end = info["data_offsets"]
            # min() first: it raises TypeError unless the dims are mutually comparable (numbers), so
            # prod() never repeats a sequence (["x" * 5000, 10**9] would build a 5 GB string). On the
            # fast path, long shapes go to the exact path, whose overflow check stops early (25,000
            # dims of 4,000 digits would otherwise make prod() run for minutes).
            dims = len(shape)
            if dims > 1 and ((fields is not None and dims > MAX_FAST_DIMS) or min(shape) < 0):
                return None
            # JSON true / false decode to bools, which multiply as 1 / 0: False always makes numel 0
            # and zero_shape_fits types every dim; True matches "1 in shape" (cheaper than scanning the
            # text for "true"), and only then are the dims typed.
            if True in shape and any(type(d) is bool for d in shape):
                return None
            numel = prod(shape)
            bits = bits_of(dtype)
            size = end - begin
            if (bits is None or type(numel) is not int or type(begin) is not int or type(end) is not int
                    or type(shape) is not list or begin < 0 or size < 0 or numel * bits != size * 8
                    or (fields is not None and len(info) != fields) or (numel == 0 and not zero_shape_fits(shape))):
                return None
            add_dtype(dtype)
            add_shape(shape)
            add_size(size)
            add_numel(numel)
            add_begin(begin)
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: a float meets a 400-digit int
        return None
    return dtypes, shapes, sizes, numels, begins


def zero_shape_fits(shape: list) -> bool:
    """The reference multiplies dims left to right with overflow checks: [2**40, 2**40, 0] overflows."""
    product = 1
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= U64_MAX:
            return False
        product *= dim
        if product > U64_MAX:
            return False
    return True


def _raise_first_invalid(obj: dict, source: str) -> None:
    for name, info in obj.items():
        try:
            dtype, shape = info["dtype"], info["shape"]
            begin, end = info["data_offsets"]
            bits = DTYPE_BITS[dtype]
            numel = math.prod(shape)
            ok = (type(numel) is int and type(begin) is int and type(end) is int and 0 <= begin <= end
                  and all(type(d) is int and d >= 0 for d in shape))
        except (KeyError, TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            _raise_entry_error(name, info, source)
        if numel * bits != (end - begin) * 8:
            raise HeaderError(
                f"tensor '{name}': shape {shape} x {dtype} is {numel * bits / 8:g} bytes but "
                f"data_offsets span {end - begin}", path=source)
    raise HeaderError("invalid tensor entry", path=source)


def _raise_contiguity(names: list[str], order: list[int], starts: list[int], ends: list[int], source: str) -> None:
    position = 0
    for i, begin, end in zip(order, starts, ends):
        if begin != position:
            kind = "overlaps the previous tensor" if begin < position else "leaves a hole before it"
            raise HeaderError(f"tensor '{names[i]}' data_offsets [{begin}, {end}] {kind} "
                              f"(expected start {position})", path=source)
        position = end


def _raise_entry_error(name: str, info: Any, source: str) -> None:
    """Explain precisely why an entry failed the fast-path checks."""
    where = f"tensor '{name}'"
    if not isinstance(info, dict):
        raise HeaderError(f"{where}: entry is not an object", path=source)
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise HeaderError(f"{where}: missing '{key}'", path=source)
    dtype = info["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:  # a list would not even hash
        raise HeaderError(f"{where}: unknown dtype {dtype!r}", path=source)
    shape = info["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise HeaderError(f"{where}: shape {shape!r} is not a list of non-negative integers", path=source)
    offsets = info["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise HeaderError(f"{where}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end",
                          path=source)
    raise HeaderError(f"{where}: invalid entry", path=source)
