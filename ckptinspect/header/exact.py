"""Exact decoding of a safetensors header, with the reference reader's JSON rules.

parser.py takes a fast path (plain ``json.loads`` plus C-speed text checks) only when the text provably
has none of the features below; every other header comes here. The reference (huggingface/safetensors,
``serde_json`` into ``HashMetadata`` / ``TensorInfo``) differs from Python's ``json`` module in that it

- rejects ``NaN`` / ``Infinity`` / ``-Infinity`` and numbers outside the f64 range (``1e400``, a
  400-digit integer), anywhere in the document;
- reads integers above u64 as floats and ``-0`` as the float ``-0.0``, so neither is a valid shape
  dimension or offset; ``true`` / ``false`` are not integers either;
- rejects a duplicate ``__metadata__`` key and a duplicate ``dtype`` / ``shape`` / ``data_offsets``
  inside one tensor entry (after unescaping: ``"data_offset\\u0073"`` is ``data_offsets``), while
  duplicate keys inside ``__metadata__`` or in unknown fields are accepted (last wins);
- ignores unknown fields of a tensor entry, rejects lone UTF-16 surrogate escapes in any string and
  nesting of 128 levels or more (serde_json's recursion limit);
- overflow-checks the shape product dimension by dimension (``[2**40, 2**40, 0]`` is an error even
  though the product is 0).

ckptinspect is deliberately stricter in two places (docs/header_conformance.md): duplicate tensor names
(the reference keeps the last) and tensor entries that are not JSON objects (the reference also accepts
the sequence form ``["F32", [1], [0, 4]]``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from ckptinspect.json_text import MAX_INT_DIGITS, check_structure
from ckptinspect.errors import HeaderError

U64_MAX = 2 ** 64 - 1
I64_MIN = -(2 ** 63)
FIELDS = ("dtype", "shape", "data_offsets")
METADATA_KEY = "__metadata__"
# serde_json's recursion limit is 128: a document whose containers nest 128 deep is refused.
MAX_HEADER_DEPTH = 127


class _Object(dict):
    """A decoded JSON object that remembers which keys were repeated (a plain dict keeps the last)."""

    __slots__ = ("repeated",)


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    obj.repeated = frozenset(k for k, n in Counter(k for k, _ in pairs).items() if n > 1) \
        if len(obj) != len(pairs) else frozenset()
    return obj


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


def _int(literal: str) -> int | float:
    if literal == "-0":
        return -0.0  # serde_json keeps the sign as a float: not an integer field value
    if len(literal) > MAX_INT_DIGITS:
        raise ValueError(f"number of {len(literal):,} digits is out of range")
    value = int(literal)
    if value > U64_MAX or value < I64_MIN:
        return _float(literal)  # serde_json's f64 fallback; out of f64 range is an error
    return value


def decode_exact(text: str, *, source: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(tensor name -> {"dtype", "shape", "data_offsets"}, metadata) of a header, or a HeaderError.

    Entries keep the reference's types exactly (shape dims and offsets are ints within u64) and drop
    unknown fields; offsets/sizes consistency is left to the caller (parser.py), shared with the fast path.
    """
    try:
        obj = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float,
                         parse_int=_int)
    except json.JSONDecodeError as exc:
        raise HeaderError(f"header is not valid JSON ({exc.msg} at char {exc.pos})", path=source) from None
    except ValueError as exc:
        raise HeaderError(f"header is not valid JSON ({exc})", path=source) from None
    except RecursionError:
        raise HeaderError(f"header nests deeper than {MAX_HEADER_DEPTH} levels", path=source) from None
    if not isinstance(obj, _Object):
        raise HeaderError("header JSON is not an object", path=source)
    check_structure(obj, source=source, error=HeaderError, strings="\\" in text, max_depth=MAX_HEADER_DEPTH)
    if METADATA_KEY in obj.repeated:
        raise HeaderError("duplicate '__metadata__' key", path=source)
    if obj.repeated:
        raise HeaderError(f"duplicate tensor name '{sorted(obj.repeated)[0]}'", path=source)
    metadata = obj.pop(METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(type(v) is str for v in metadata.values()):
        raise HeaderError("__metadata__ must map strings to strings", path=source)
    entries = {name: _entry(name, info, source) for name, info in obj.items()}
    return entries, dict(metadata)


def _entry(name: str, info: Any, source: str) -> dict[str, Any]:
    where = f"tensor '{name}'"
    if not isinstance(info, dict):
        raise HeaderError(f"{where}: entry is not an object", path=source)
    repeated = [f for f in FIELDS if f in info.repeated]  # type: ignore[attr-defined]
    if repeated:
        raise HeaderError(f"{where}: duplicate field '{repeated[0]}'", path=source)
    for key in FIELDS:
        if key not in info:
            raise HeaderError(f"{where}: missing '{key}'", path=source)
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if type(shape) is not list or not all(type(d) is int and 0 <= d <= U64_MAX for d in shape):
        raise HeaderError(f"{where}: shape {_short(shape)} is not a list of non-negative integers "
                          "(each below 2**64)", path=source)
    if (type(offsets) is not list or len(offsets) != 2
            or not all(type(o) is int and 0 <= o <= U64_MAX for o in offsets)):
        raise HeaderError(f"{where}: data_offsets {_short(offsets)} is not [begin, end] of integers "
                          "with 0 <= begin <= end < 2**64", path=source)
    product = 1
    for dim in shape:  # the reference's checked multiplication, one dimension at a time
        product *= dim
        if product > U64_MAX:
            raise HeaderError(f"{where}: shape {_short(shape)} overflows 64 bits", path=source)
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
