"""The one decoder for JSON metadata files: config.json, hf_quant_config.json, generation_config.json,
model.safetensors.index.json (local or from the Hub) and metadata snapshots.

Python's ``json`` module turns several hostile inputs into exceptions that are not JSONDecodeError
(a ValueError for integers over the interpreter's digit limit, a RecursionError for deep nesting) or
into values later code cannot handle (lone UTF-16 surrogates, which fail on the first ``encode``).
Every such case becomes one ``ConfigError`` line naming the file. Safetensors headers have their own,
stricter decoder (ckptinspect/header/exact.py) that mirrors the reference reader.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Literal

from ckptinspect.errors import CkptInspectError, ConfigError

# Deepest nesting accepted: 127 levels, the most serde_json (the JSON parser of the Rust readers,
# safetensors and tokenizers) accepts with its default recursion limit of 128. Real metadata files
# nest fewer than 10 levels; Python's own decoder would raise RecursionError near 1,000.
MAX_JSON_DEPTH = 127
# Longest integer literal accepted. CPython refuses int() of more than 4,300 digits by default
# (conversion is quadratic), but that limit can be lifted with PYTHONINTMAXSTRDIGITS=0; this keeps
# the bound whatever the environment says. No metadata value needs more than 20 digits (u64).
MAX_INT_DIGITS = 4300
# Most values (containers + elements) a document may build, bounded before parsing by counting the
# bytes that can start one ("," "[" "{"; those inside strings count too, so this over-counts). A byte
# cap alone does not bound memory: ``[[],[],...]`` builds a 56-byte list per 3 bytes, so 300 MiB of
# legal-looking JSON became 7 GB of objects. Every value costs at most ~72 bytes (an empty dict plus
# its slot), so 4M values stay under ~300 MB. The largest real index (371k tensors) counts ~0.75M.
MAX_JSON_ITEMS = 4_000_000
# A JSON escape that decodes to a UTF-16 surrogate (\uD800-\uDFFF). Only when the text contains one
# can a decoded string hold a lone surrogate; an escaped backslash before "ud8.." is a false positive
# that costs one exact walk, never a wrong answer.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# msgspec's decoder answers first (it is faster than json on large files: BENCHMARKS.md). It gives
# json's answer whenever it accepts: integers stay exact up to 4,300 digits (the same bound as
# MAX_INT_DIGITS; longer ones it refuses whatever PYTHONINTMAXSTRDIGITS says), repeated keys keep the
# last value, floats round alike. What it refuses (NaN, Infinity, 1e400, lone surrogate escapes,
# invalid UTF-8, deep nesting, long integers) goes to json, so the errors and answers stay json's
# (tests/test_json_decoders.py compares it with json). Without msgspec, json alone gives the same answers.
try:
    import msgspec
except ImportError:  # pragma: no cover - a core dependency; json alone then gives the same answers
    msgspec = None


_compiled_loads = msgspec.json.Decoder().decode if msgspec is not None else None


def _bounded_int(literal: str) -> int:
    if len(literal) > MAX_INT_DIGITS + (literal[0] == "-"):
        raise ValueError(f"an integer of {len(literal):,} digits (more than {MAX_INT_DIGITS:,})")
    return int(literal)


def decode_json(data: bytes | str, *, source: str, error: type[CkptInspectError] = ConfigError,
                what: str | None = None, max_items: int = MAX_JSON_ITEMS) -> Any:
    """Decode one JSON document; every malformed or hostile input raises ``error`` naming ``source``
    (its message starts with ``what``, when given, e.g. "not a JSON snapshot").

    Raises:
        error (ConfigError by default): invalid UTF-8 or JSON, an integer over MAX_INT_DIGITS digits,
        nesting deeper than MAX_JSON_DEPTH, or a string holding a lone UTF-16 surrogate.
    """
    if what is not None:
        error = _prefixed(error, what)
    _check_value_bound(data, source, error, max_items)
    return _decode_bounded(data, source, error)


def _check_value_bound(data: bytes | bytearray | memoryview | str, source: str, error: Any, max_items: int) -> None:
    items = _value_bound(data, max_items)
    if items > max_items:
        raise error(f"would build up to {items:,} JSON values, over the {max_items:,} cap", path=source)


def _decode_bounded(data: bytes | bytearray | memoryview | str, source: str, error: Any) -> Any:
    """decode_json once the document's value bound has been checked."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    obj = _compiled(data)
    if obj is not _REFUSED:
        # msgspec refuses lone surrogates and invalid UTF-8, so only the depth is left to check.
        check_structure(obj, source=source, error=error, strings=False)
        return obj
    text = _text(data, source, error)
    try:
        obj = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise error(f"is not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})", path=source) from None
    except ValueError as exc:  # _bounded_int, or the interpreter's own digit limit
        raise error(f"is not usable JSON ({exc})", path=source) from None
    except RecursionError:
        raise error(f"nests deeper than {MAX_JSON_DEPTH} levels", path=source) from None
    escapes = "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None  # C-speed find first
    check_structure(obj, source=source, error=error, strings=escapes)
    return obj


# An index (model.safetensors.index.json, Mistral's consolidated one) as its writers make it: the object
# ``{"metadata": {...}, "weight_map": {tensor: shard}}`` in either order, ``metadata`` optional. Its first key
# is read from the bytes to rebuild the members in document order (an escaped key goes to decode_json).
_INDEX_FIRST_KEY = re.compile(rb'[ \t\n\r]*\{[ \t\n\r]*"(metadata|weight_map)"')


def decode_index_json(data: bytes, *, source: str, shard_files: Iterable[str] = (),
                      max_items: int = MAX_JSON_ITEMS) -> Any:
    """decode_json's answer for an index document, built by one typed decode where the document is an
    index as written (``weight_map`` an object of strings, ``metadata`` optional, no other member): the
    371k-entry map then needs no structure walk, and a shard name that is one of ``shard_files`` (the files
    the caller lists) is decoded as that one string object, not once per tensor (BENCHMARKS.md). Every other
    document, and every one the typed decode refuses (a shard not listed, a non-string value, an escaped
    key, NaN, deep nesting, invalid UTF-8), is decode_json's, so the answer and the errors are always
    decode_json's (tests/test_json_decoders.py compares the two).

    Raises:
        ConfigError: as decode_json.
    """
    _check_value_bound(data, source, ConfigError, max_items)  # counted once, for either decode
    first = _INDEX_FIRST_KEY.match(data) if isinstance(data, bytes) else None
    decoded = _typed_index(data, shard_files) if first is not None else None
    if decoded is None:
        return _decode_bounded(data, source, ConfigError)
    weight_map, metadata = decoded.weight_map, decoded.metadata
    if metadata is msgspec.UNSET:
        return {"weight_map": weight_map}
    if isinstance(metadata, (dict, list)):  # one level below the document: its depth is one less
        try:
            check_structure(metadata, source=source, strings=False, max_depth=MAX_JSON_DEPTH - 1)
        except ConfigError:
            return _decode_bounded(data, source, ConfigError)  # decode_json's path, which words the error
    if first.group(1) == b"metadata":
        return {"metadata": metadata, "weight_map": weight_map}
    return {"weight_map": weight_map, "metadata": metadata}


def _typed_index(data: bytes, shard_files: Iterable[str]) -> Any:
    """The typed decode of an index (``weight_map`` values drawn from ``shard_files`` when any), or None."""
    if msgspec is None:  # pragma: no cover - a core dependency
        return None
    shards = tuple(sorted(set(shard_files)))

    value = Literal[shards] if shards else str  # a listed name decodes as the Literal's own string object
    document = msgspec.defstruct("IndexDocument", [("weight_map", dict[str, value]), ("metadata", Any, msgspec.UNSET)],
                                 forbid_unknown_fields=True, gc=False)
    try:
        return msgspec.json.Decoder(document).decode(data)
    except (msgspec.MsgspecError, RecursionError):
        return None


def _text(data: bytes | str, source: str, error: Any) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"is not valid UTF-8 (byte {exc.start})", path=source) from None


_REFUSED = object()


def _compiled(data: bytes | str) -> Any:
    """The compiled parser's answer, else _REFUSED (none installed, or it refused the document)."""
    if _compiled_loads is None:
        return _REFUSED
    try:
        return _compiled_loads(data)
    except (ValueError, RecursionError):  # msgspec's decode errors: json decides and words it
        return _REFUSED


def _value_bound(data: bytes | bytearray | memoryview | str, cap: int) -> int:
    """An upper bound on the values ``data`` decodes to: the count of the bytes that can start one (one
    C-speed pass), or the length when that alone is within ``cap`` (each counted byte is one byte of the
    document, so the count could not pass ``cap`` either)."""
    if len(data) < cap:
        return len(data) + 1
    if isinstance(data, memoryview):
        data = data.tobytes()
    if isinstance(data, str):
        return _occurrences(data, ",") + _occurrences(data, "[") + _occurrences(data, "{") + 1
    return _occurrences(data, b",") + _occurrences(data, b"[") + _occurrences(data, b"{") + 1  # no copy


def _occurrences(data: Any, char: Any) -> int:
    """``data.count(char)``, found by ``find`` (memchr) while it is rare: an index holds a handful of "{" and
    no "[", and three counting passes over its 41 MB cost 35 ms against 15 ms this way (one count, two finds)."""
    found, at = 0, data.find(char)
    while at >= 0:
        found += 1
        if found == 64:  # not rare: one counting pass over the rest
            return found + data.count(char, at + 1)
        at = data.find(char, at + 1)
    return found


def check_structure(obj: Any, *, source: str, error: type[CkptInspectError] = ConfigError,
                    strings: bool = True, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Raise ``error`` when ``obj`` nests deeper than ``max_depth`` or (``strings``) holds a lone surrogate;
    return whether it holds a float anywhere.

    Breadth-first over containers only: a level's values are typed in C (``set(map(type, ...))``), so a
    flat index (one dict of strings) is one C-level pass when ``strings`` is False.
    """
    floats = type(obj) is float
    level = [obj] if isinstance(obj, (dict, list)) else []
    if strings and isinstance(obj, str):
        _check_string(obj, source, error)
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise error(f"nests deeper than {max_depth} levels", path=source)
        deeper = []
        for node in level:
            values = list(node.values()) if isinstance(node, dict) else node
            if strings:
                if isinstance(node, dict):
                    for key in node:
                        _check_string(key, source, error)
                for value in values:
                    if type(value) is str:
                        _check_string(value, source, error)
            kinds = set(map(type, values))
            floats = floats or float in kinds
            if any(issubclass(kind, (dict, list)) for kind in kinds):
                deeper.extend(v for v in values if isinstance(v, (dict, list)))
        level = deeper
    return floats


def _prefixed(error: type[CkptInspectError], what: str) -> Any:
    def make(message: str, *, path: str | None = None) -> CkptInspectError:
        return error(f"{what}: {message}", path=path)
    return make


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` cannot be encoded as UTF-8 (it holds an unpaired surrogate code point)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_string(text: str, source: str, error: type[CkptInspectError]) -> None:
    if has_lone_surrogate(text):
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:80]
        raise error(f"holds a lone UTF-16 surrogate escape in the string '{shown}'", path=source)
