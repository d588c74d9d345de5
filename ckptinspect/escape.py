"""Control characters from the checkpoint never reach a terminal raw.

Names, config values, file names and weight_map values are attacker-chosen strings: an ESC starts a
terminal escape sequence (cursor moves, title and clipboard writes), CR / BEL / backspace redraw the
line, a newline in a file name splits the one error line into two (the second attacker-written), and
bidirectional overrides reorder what is shown. Text and markdown renderers therefore take records
whose every string went through ``escape_controls`` (``escaped``), and every error line does too
(errors.py). JSON needs nothing: the encoder escapes C0 controls itself, and consumers decode them.
Our own colour (click.style around verdicts and severities) is added after escaping, so it survives.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from functools import lru_cache
from typing import Any, Mapping

# C0 and C1 controls, DEL, the Unicode line / paragraph separators and the bidi embedding, override and
# isolate characters (Trojan Source, CVE-2021-42574).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Element types a sequence of only which holds no string: returned without a walk (typed in C).
_NUMBERS = frozenset({int, float, bool, type(None)})


def _escape_one(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control / line-breaking / bidi character written as a visible escape."""
    return _UNSAFE.sub(_escape_one, text) if _UNSAFE.search(text) else text


def escaped(obj: Any) -> Any:
    """A copy of a record tree (frozen dataclasses, tuples, lists, mappings, sets) with every string
    escaped; objects without unsafe strings are returned as they are (no copy)."""
    return _walk(obj, {})


@lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type (dataclasses.fields is slow per object), None for any other."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


def _walk(obj: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, str):
        return escape_controls(obj)
    if obj is None or isinstance(obj, (int, float, bool, bytes)):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    out: Any = obj
    names = _field_names(type(obj))
    if names is not None:
        changed = {}
        for name in names:
            value = getattr(obj, name)
            new = _walk(value, memo)
            if new is not value:
                changed[name] = new
        if changed:
            out = copy.copy(obj)
            for name, value in changed.items():
                object.__setattr__(out, name, value)
    elif isinstance(obj, (tuple, list)):
        if _NUMBERS.issuperset(map(type, obj)):  # e.g. a group's expert ids (371k in a 397B report)
            return obj
        items = [_walk(v, memo) for v in obj]
        if any(a is not b for a, b in zip(items, obj)):
            out = type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    elif isinstance(obj, (set, frozenset)):
        items = [_walk(v, memo) for v in obj]
        if any(a is not b for a, b in zip(items, obj)):
            out = type(obj)(items)
    elif isinstance(obj, Mapping):
        pairs = [(_walk(k, memo), _walk(v, memo)) for k, v in obj.items()]
        if any(a is not k or b is not v for (a, b), (k, v) in zip(pairs, obj.items())):
            out = dict(pairs)
    memo[key] = out
    return out
