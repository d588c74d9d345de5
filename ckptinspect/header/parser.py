"""Bounded, validating safetensors header parser (a pure function over bytes).

File layout: ``[0:8)`` little-endian u64 N, ``[8:8+N)`` UTF-8 JSON object (space padded), then the
data buffer that every ``data_offsets`` pair is relative to. The checks mirror the reference
implementation's ``Metadata::validate`` (huggingface/safetensors, safetensors/src/tensor.rs): known
dtype, ``numel * bits == 8 * (end - begin)``, offsets contiguous from 0 without holes or overlaps, and
``8 + N + last_end == file size`` when the size is known. Sizes always come from ``data_offsets``,
never from a dtype table, so packed formats (U8 nibble pairs, F4, E8M0) stay exact.

The JSON itself is read with the reference's rules (serde_json: no NaN, no repeated fields, no lone
surrogates, ...) on one of two paths: the fast path (header/typed.py: msgspec's typed decode, which
answers only where it provably reads the header as the reference does, with every size checked) takes
every real header; everything else goes through the exact path (header/exact.py and the per-entry checks
here), which also words every error. Both give the same columns; the checks of the data buffer as a whole
(tiling, end, file size) are one code for both. tests/test_conformance.py checks the accept / reject
answers against the ``safetensors`` library, tests/test_scan_fast.py the fast path against the exact one;
docs/header_conformance.md lists the two deliberate differences.
"""

from __future__ import annotations

import math
import struct
from itertools import accumulate
from math import prod
from operator import add
from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import HeaderError
from ckptinspect.header.exact import U64_MAX, decode_exact
from ckptinspect.header.format import DTYPE_BITS, zero_shape_fits
from ckptinspect.header.typed import plain_columns

__all__ = ["DTYPE_BITS", "Header", "MAX_DATA_BYTES", "MAX_HEADER_LENGTH", "PREFIX_BYTES", "parse_header",
           "parse_header_exact", "read_length_prefix", "zero_shape_fits"]

# The reference reader refuses headers above 100,000,000 bytes (MAX_HEADER_SIZE in tensor.rs).
MAX_HEADER_LENGTH = 100_000_000
PREFIX_BYTES = 8
# Every tensor's bit count (numel * bits) must fit in 64 bits, as in the reference's checked
# multiplication; bounding the end of the data buffer by 2**64 / 8 bounds all of them at once.
MAX_DATA_BYTES = U64_MAX // 8


@dataclass(frozen=True)
class Header:
    """A validated header, as columns in entry order (one form, whichever path decoded it)."""

    length: int  # N
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    sizes: list[int]  # bytes (end - begin)
    begins: list[int]  # data_offsets[0]
    metadata: Mapping[str, str]
    data_bytes: int  # end of the data buffer

    @property
    def numels(self) -> list[int]:
        """Element count per tensor (scalars count 1), computed on each call."""
        return list(map(prod, self.shapes))

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        """name -> {"dtype", "shape", "data_offsets"}, built from the columns on each call (for callers that
        want the format's own form; the report never asks)."""
        return {name: {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, begin + size]}
                for name, dtype, shape, size, begin in zip(self.names, self.dtypes, self.shapes, self.sizes,
                                                           self.begins)}


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
    columns = plain_columns(data)  # the fast path: every real header
    if columns is None:
        columns = _exact_columns(data, source)
    return _checked(data, columns, source, file_size)


def parse_header_exact(data: bytes, *, source: str, file_size: int | None = None) -> Header:
    """parse_header through the exact path alone: the same answer, slower (the differential's reference)."""
    return _checked(data, _exact_columns(data, source), source, file_size)


def _exact_columns(data: bytes, source: str) -> tuple:
    """The columns as plain_columns gives them, decoded with the reference's JSON rules; raises the
    HeaderError that explains the first problem."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header is not valid UTF-8 (byte {exc.start})", path=source) from None
    obj, metadata = decode_exact(text, source=source)
    columns = _columns(obj)
    if columns is None:
        _raise_first_invalid(obj, source)  # always raises
    dtypes, shapes, sizes, _, begins = columns  # type: ignore[misc]
    return list(obj), dtypes, list(map(tuple, shapes)), sizes, begins, metadata


def _checked(data: bytes, columns: tuple, source: str, file_size: int | None) -> Header:
    """The Header of validated entry columns, once the data buffer they describe checks out as a whole."""
    length = len(data)
    names, dtypes, shapes, sizes, begins, metadata = columns

    # Contiguity: sorted by (begin, end) as the reference does (an empty tensor may share its start
    # with the next one), each tensor begins where the previous one ended (compared as whole lists,
    # in C). The safetensors library writes entries in offset order, so the entry order is tried
    # first: a chain from 0 in any order tiles the buffer exactly, which is what the sorted check
    # proves, and it spares the sort. Otherwise sorting by begin alone
    # is cheaper and stable; the (begin, end) order is needed only when that comparison fails too.
    chain = list(accumulate(sizes, initial=0))  # where each tensor must begin if the entry order tiles
    position = chain.pop()
    if chain != begins:
        order = sorted(range(len(begins)), key=begins.__getitem__)
        starts = list(map(begins.__getitem__, order))
        ends = list(map(add, starts, map(sizes.__getitem__, order)))
        if starts[0] != 0 or starts[1:] != ends[:-1]:
            order = sorted(range(len(begins)), key=lambda i: (begins[i], sizes[i]))
            starts = list(map(begins.__getitem__, order))
            ends = list(map(add, starts, map(sizes.__getitem__, order)))
            if starts[0] != 0 or starts[1:] != ends[:-1]:
                _raise_contiguity(names, order, starts, ends, source)
        position = ends[-1]
    if position > MAX_DATA_BYTES:
        raise HeaderError(f"data_offsets end at {position:,}, beyond what 64-bit sizes can address",
                          path=source)
    if file_size is not None and PREFIX_BYTES + length + position != file_size:
        raise HeaderError(
            f"data ends at byte {PREFIX_BYTES + length + position:,} but the file has {file_size:,} bytes"
            " (truncated or trailing data)", path=source)
    return Header(length=length, names=names, dtypes=dtypes, shapes=shapes, sizes=sizes, begins=begins,
                  metadata=metadata, data_bytes=position)


def _columns(obj: dict) -> tuple[list, list, list, list, list] | None:
    """Validated columns (dtypes, shapes, sizes, numels, begins) of exactly decoded entries, or None when
    any entry is invalid (the caller then re-walks the entries to explain the first failure).

    A single negative dim makes numel negative and fails the size check; two or more could cancel
    out, hence min() for multi-dim shapes. A zero-element tensor gets the reference's dimension-wise
    overflow check (its product alone proves nothing); any other tensor's dims are bounded by its
    byte size, which the caller bounds.
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
            # prod() never repeats a sequence (["x" * 5000, 10**9] would build a 5 GB string).
            if len(shape) > 1 and min(shape) < 0:
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
                    or (numel == 0 and not zero_shape_fits(shape))):
                return None
            add_dtype(dtype)
            add_shape(shape)
            add_size(size)
            add_numel(numel)
            add_begin(begin)
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: a float meets a 400-digit int
        return None
    return dtypes, shapes, sizes, numels, begins


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
