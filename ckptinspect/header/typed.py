"""parse_header's fast path: a plain safetensors header decoded and type-checked in one compiled pass
(msgspec), then its sizes checked over whole columns.

parser.py tries this first. It answers only when the typed decode provably reads the header as the
reference reader does (huggingface/safetensors, ``serde_json`` into ``TensorInfo``), every entry has
exactly the three fields and every tensor's byte size is its shape times its dtype's bits; everything
else returns None and parser.py takes its exact path, which decides and explains. So this module never
raises a HeaderError of its own and never accepts what the exact path refuses (tests/test_scan_fast.py
compares the two on valid and invalid headers). What both paths check afterwards (the data buffer tiled
from 0, its end within 64-bit sizes and at the file's end) is parser.py's.

What the decoder checks in C: the JSON syntax (no NaN, no trailing commas, no control characters in
strings, valid UTF-8), every entry an object with exactly ``dtype`` / ``shape`` / ``data_offsets``
(``forbid_unknown_fields``; a missing field is an error), a dtype the format defines, a shape of at
most ``MAX_FAST_DIMS`` dims, dims and offsets non-negative integers (strict: ``true`` / ``1.0`` are
not integers). What it cannot see, ruled out here on the bytes:

- repeated keys (a repeated tensor name or field reads as the last one): every key/value pair of the
  tensor part holds exactly one ``:``, so ``4 * entries`` colons prove none was repeated (and no
  string holds a ``:``);
- ``-0``, which msgspec reads as the integer 0 and the reference as the float ``-0.0`` (not a size):
  any other negative number fails ``ge=0``, and a number in an array follows ``[``, ``,`` or
  whitespace;
- escapes (lone surrogates, escaped field names): no backslash at all;
- integers past 64 bits, which msgspec reads as Python ints: parser.py bounds every offset by the end
  of the data buffer, and the size check here bounds every dim of a non-empty tensor by its byte size;
  a zero-element shape gets the reference's dimension-wise overflow check (format.zero_shape_fits).

``__metadata__`` is not a tensor entry. Where it comes first, as the safetensors library writes it
(``{"__metadata__":{...},"name":...``), or last, as writers that append it to a dict do
(``...,"__metadata__":{...}}``), compact or spaced out, it is decoded on its own as a string map and the
rest as the tensor map; elsewhere (or as ``null``) parser.py takes the header.
"""

from __future__ import annotations

import re
from math import prod
from operator import attrgetter, itemgetter, sub
from typing import Annotated, Literal

from ckptinspect.header.format import DTYPE_BITS, zero_shape_fits

try:
    import msgspec
except ImportError:  # pragma: no cover - a core dependency; without it every header takes parser.py
    msgspec = None

# Real tensors have at most 5 dims; longer shapes are left to the exact path.
MAX_FAST_DIMS = 8
_DTYPE, _SHAPE, _OFFSETS = attrgetter("dtype"), attrgetter("shape"), attrgetter("data_offsets")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)

if msgspec is not None:
    _Count = Annotated[int, msgspec.Meta(ge=0)]

    class TensorEntry(msgspec.Struct, forbid_unknown_fields=True, gc=False):
        """One tensor entry as the typed decode reads it (shape as a tuple: ~5% less decode CPU)."""

        dtype: Literal[tuple(DTYPE_BITS)]  # type: ignore[valid-type]  # the dtypes the format defines
        shape: Annotated[tuple[_Count, ...], msgspec.Meta(max_length=MAX_FAST_DIMS)]
        data_offsets: tuple[_Count, _Count]

    _ENTRIES = msgspec.json.Decoder(dict[str, TensorEntry])
    _METADATA = msgspec.json.Decoder(dict[str, str])

_JSON_WHITESPACE = b" \t\n\r"  # bytes.strip() would also take \x0b and \x0c, which JSON refuses
_METADATA_KEY = b'"__metadata__"'
# '{"__metadata__":' up to its value's "{", at the start; then the "," and the next key's quote.
_METADATA_FIRST = re.compile(rb'[ \t\n\r]*\{[ \t\n\r]*"__metadata__"[ \t\n\r]*:[ \t\n\r]*(?=\{)')
_NEXT_KEY = re.compile(rb'[ \t\n\r]*,[ \t\n\r]*(?=")')
_KEY_VALUE = re.compile(rb'[ \t\n\r]*:[ \t\n\r]*(?=\{)')  # after a key, up to its value's "{"
# Metadata is small (a format tag, a few strings); a larger one at the end costs parser.py's path.
_METADATA_LAST_WINDOW = 65536
# Where a JSON number can start inside an array (JSON whitespace is these four bytes).
_NEGATIVE_ZERO = (b"[-0", b",-0", b" -0", b"\n-0", b"\r-0", b"\t-0")


PlainColumns = tuple[list[str], list[str], list[tuple[int, ...]], list[int], list[int], dict[str, str]]


def plain_columns(data: bytes) -> PlainColumns | None:
    """(names, dtypes, shapes, sizes, begins, metadata) of ``data`` (the header bytes after the length
    prefix), in entry order, when the typed decode provably reads it as the reference reader does and
    every tensor's size matches its shape and dtype; None when the exact path must decide.

    The columns are taken with C-level maps; the size rule (``numel * bits == size * 8``, and the
    overflow rule of zero-element shapes) is checked once per distinct (dtype, shape, size): a real
    header of 4,000 tensors has a few dozen."""
    decoded = decode_plain(data)
    if decoded is None:
        return None
    entries, metadata = decoded
    infos = list(entries.values())
    dtypes = list(map(_DTYPE, infos))
    shapes = list(map(_SHAPE, infos))
    offsets = list(map(_OFFSETS, infos))
    begins = list(map(_FIRST, offsets))
    sizes = list(map(sub, map(_SECOND, offsets), begins))
    for dtype, shape, size in dict.fromkeys(zip(dtypes, shapes, sizes)):
        numel = prod(shape)
        if numel * DTYPE_BITS[dtype] != size * 8 or (numel == 0 and not zero_shape_fits(shape)):
            return None
    return list(entries), dtypes, shapes, sizes, begins, metadata


def decode_plain(data: bytes) -> tuple[dict[str, TensorEntry], dict[str, str]] | None:
    """(tensor name -> TensorEntry in header order, the metadata map) when the typed decode provably reads
    ``data`` as the reference reader does; None when the exact path must."""
    # b"-" first: a one-byte search is memchr, ~20x faster than the two-byte one
    if msgspec is None or b"\\" in data or (b"-" in data and any(token in data for token in _NEGATIVE_ZERO)):
        return None
    tensors = (0, len(data))
    body = data
    metadata: dict[str, str] | None = {}
    first = _METADATA_FIRST.match(data)
    if first is not None:
        # The first "}" closes the metadata object: a JSON parser reading up to that byte is either
        # inside a string or a nested container (then the slice is malformed and the decode fails) or
        # has just closed the object, and values are strings, so no "}" closed anything earlier. A
        # tensor key must follow: '{' + the rest then holds every tensor member and nothing else.
        end = data.find(b"}", first.end())
        after = _NEXT_KEY.match(data, end + 1) if end >= 0 else None
        metadata = _metadata(memoryview(data)[first.end():end + 1]) if after is not None else None
        if metadata is None:
            return None
        tensors = (after.end(), len(data))
        body = b"".join((b"{", memoryview(data)[after.end():]))  # one copy, ~0.05 ms per MB
    else:
        key = data.rfind(_METADATA_KEY, max(0, len(data) - _METADATA_LAST_WINDOW))
        if key >= 0:
            # Last: once the metadata member is cut, the tensor part must be a valid object with at
            # least one member, so the comma before the key is at the top level after a whole member
            # (``{,"__metadata__":...}`` would decode as ``{}``: hence the count check below), and the
            # metadata object runs to the document's closing "}", with only whitespace after it.
            before = data[max(0, key - 64):key]
            kept = before.rstrip(_JSON_WHITESPACE)
            value = _KEY_VALUE.match(data, key + len(_METADATA_KEY))
            close = data.rfind(b"}")
            if not kept.endswith(b",") or value is None or data[close + 1:].strip(_JSON_WHITESPACE):
                return None
            metadata = _metadata(memoryview(data)[value.end():close])
            if metadata is None:
                return None
            comma = key - len(before) + len(kept) - 1
            tensors = (0, comma)
            body = b"".join((memoryview(data)[:comma], b"}"))
    try:
        entries = _ENTRIES.decode(body)
    except msgspec.MsgspecError:
        return None
    if ("__metadata__" in entries or data.count(b":", *tensors) != 4 * len(entries)
            or (not entries and tensors != (0, len(data)))):
        return None
    return entries, metadata


def _metadata(text: memoryview) -> dict[str, str] | None:
    """``text`` decoded when it is exactly one JSON object of strings (the format's metadata map), else None."""
    try:
        return _METADATA.decode(text)
    except msgspec.MsgspecError:
        return None
