"""JSON answers of servers (the Hub's listing and repo info, an inference engine's replies), decoded under
the bounds of every JSON file the tool reads (json_text.py: size, depth, value count, integer digits,
lone surrogates) plus one more: no NaN or Infinity. Python's ``json`` accepts ``NaN``, ``Infinity`` and
``1e400`` (which it turns into ``inf``); a counter or a token id that is not a finite number is not an
answer any client can use, so it is refused with one line naming the server and what it sent."""

from __future__ import annotations

import math
from typing import Any

from ckptinspect.errors import CkptInspectError, NetworkError
from ckptinspect.json_text import decode_json

# Values one answer may build: a listing page of 1,000 repos with their file lists is ~100k values,
# an engine's hidden-state rows (--main-url) are the largest answers (prompt rows x hidden size floats).
MAX_ANSWER_VALUES = 4_000_000


def decode_answer(body: bytes, *, source: str, error: type[CkptInspectError] = NetworkError,
                  max_items: int = MAX_ANSWER_VALUES) -> Any:
    """Decode one server answer; any malformed, hostile or non-finite input is one ``error`` line."""
    value = decode_json(body, source=source, error=error, what="answer is not usable JSON", max_items=max_items)
    bad = _non_finite(value)
    if bad is not None:
        raise error(f"answer holds the non-finite number {bad} (NaN and Infinity are not JSON)", path=source)
    return value


def _non_finite(value: Any) -> str | None:
    """The first float of ``value`` that is NaN or infinite, as text; None when there is none. Iterative
    (the depth is already bounded, but a walk must not recurse on input)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is float:
            if not math.isfinite(node):
                return repr(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None
