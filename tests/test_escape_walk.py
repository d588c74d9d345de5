"""``escaped`` (ckptinspect/escape.py) against a plain reference walk: every string of a record tree
escaped, whatever the shortcuts (number-only sequences returned as they are, field names per type)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptinspect.escape import escape_controls, escaped


@dataclasses.dataclass(frozen=True)
class Leaf:
    name: str
    subs: tuple
    extra: Any = None


def reference(obj: Any) -> Any:
    """The tree with every string escaped, rebuilt everywhere (no sharing, no shortcut)."""
    if isinstance(obj, str):
        return escape_controls(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: reference(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, (tuple, list)):
        return type(obj)(reference(v) for v in obj)
    if isinstance(obj, (set, frozenset)):
        return type(obj)(reference(v) for v in obj)
    if isinstance(obj, dict):
        return {reference(k): reference(v) for k, v in obj.items()}
    return obj


_text = st.text(alphabet=st.sampled_from(["a", "b", "\x1b", "\n", "\u202e", "7", " "]), max_size=4)
_scalar = _text | st.integers(-3, 3) | st.floats(allow_nan=False) | st.booleans() | st.none()
_tree = st.recursive(
    _scalar,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                   | st.frozensets(_text | st.integers(0, 5), max_size=3)
                   | st.dictionaries(_text, inner, max_size=3)
                   | st.builds(Leaf, _text, st.lists(st.integers(0, 9) | _text, max_size=5).map(tuple), inner)),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(_tree)
def test_escaped_equals_the_reference_walk(tree):
    assert escaped(tree) == reference(tree)


def test_number_only_sequences_are_kept_and_strings_beside_numbers_are_not():
    subs = tuple(range(1000))
    leaf = Leaf("ok", subs)
    assert escaped(leaf) is leaf and escaped(leaf).subs is subs
    mixed = Leaf("ok", (1, 2, "x\x1b[31m"))
    assert escaped(mixed).subs == (1, 2, "x\\x1b[31m")
