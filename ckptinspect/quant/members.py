"""Which members of a tensor group must be asked about the exclude lists, exactly.

The members of a group (e.g. the 256 routed experts of an MTP layer) differ only in the digits of
their numeric segments. An exclude entry that has no digit, character class or similar construct in
the part that can reach those segments cannot tell two members apart whose numbers have the same
digit counts: glob ``*`` / ``?`` and regex ``.``, ``\\d``, ``\\w``, quantifiers without counts treat
every digit alike. So unless some entry may distinguish members, one member per digit-count
signature answers for all of them (one member for the whole group when, in addition, every entry
is a glob whose only wildcard there is ``*``); otherwise every member is asked. tests/test_verdict_invariant.py
checks the shortcut against asking every member.
"""

from __future__ import annotations

import bisect
from functools import lru_cache
from typing import Iterable, Sequence

from ckptinspect.records import ExcludeList, TensorGroup

_GLOB_META = "*?["
_REGEX_META = ".^$*+?{}[]\\|()"


def _literal(body: str, meta: str) -> str:
    for i, ch in enumerate(body):
        if ch in meta:
            return body[:i]
    return body


def _entries(excludes: Iterable[ExcludeList]) -> Iterable[tuple[str, str]]:
    """(pattern body, kind) with kind glob | regex | exact, following quant/declared.py ExcludeMatcher."""
    for lst in excludes:
        for entry in lst.entries:
            if lst.semantics in ("modelopt_glob", "glob", "include_map"):
                yield entry, "glob"
            elif lst.semantics == "gptq_dynamic" or (lst.semantics == "ct_regex" and entry.startswith("re:")):
                yield (entry[3:] if entry.startswith("re:") else entry), "regex"
            else:
                yield entry, "exact"


def may_distinguish(body: str, kind: str, fixed: str, lit: str | None = None) -> bool:
    """Whether an entry could answer differently for two names that start with ``fixed`` and differ
    only in digits after it (same digit counts). Matching is anchored at the start in every list kind."""
    if kind == "exact":
        return body.startswith(fixed)
    if lit is None:
        lit = _literal(body, _GLOB_META if kind == "glob" else _REGEX_META)
    n = min(len(lit), len(fixed))
    if lit[:n] != fixed[:n]:
        return False  # its literal head already differs from every member
    rest = body[len(fixed):] if len(lit) >= len(fixed) else body[len(lit):]
    if any(c.isdigit() for c in rest) or "[" in rest:
        return True
    return kind == "regex" and ("(?P=" in rest or "\\N" in rest or "\\p" in rest)


class _Entries:
    """Every entry of a set of lists as (body, kind, literal head), indexed by literal head so that the
    entries able to match names under a prefix are found without scanning the whole list."""

    def __init__(self, excludes: tuple[ExcludeList, ...]) -> None:
        self.entries = tuple((body, kind, body if kind == "exact" else
                              _literal(body, _GLOB_META if kind == "glob" else _REGEX_META))
                             for body, kind in _entries(excludes))
        self.by_head: dict[str, list[tuple[str, str, str]]] = {}
        for entry in self.entries:
            self.by_head.setdefault(entry[2], []).append(entry)
        self.heads = sorted(self.by_head)
        self._classified: dict[str, tuple[bool, bool]] = {}

    def classify(self, fixed: str) -> tuple[bool, bool]:
        """(some entry may distinguish members under ``fixed``, some entry may count their digits),
        cached per prefix (the gate / up / down groups of a layer share it)."""
        hit = self._classified.get(fixed)
        if hit is None:
            entries = list(self.compatible(fixed))
            hit = self._classified[fixed] = (
                any(may_distinguish(body, kind, fixed, lit) for body, kind, lit in entries),
                any(_count_sensitive(body, kind, fixed, lit) for body, kind, lit in entries))
        return hit

    def compatible(self, fixed: str) -> Iterable[tuple[str, str, str]]:
        """Entries whose literal head is a prefix of ``fixed`` or starts with it (every other entry
        differs from every name under ``fixed`` before its first wildcard)."""
        for end in range(len(fixed)):  # heads shorter than fixed, "" included
            yield from self.by_head.get(fixed[:end], ())
        i = bisect.bisect_left(self.heads, fixed)
        while i < len(self.heads) and self.heads[i].startswith(fixed):
            yield from self.by_head[self.heads[i]]
            i += 1


def _count_sensitive(body: str, kind: str, fixed: str, lit: str) -> bool:
    """Whether a non-distinguishing entry could still tell members apart by how many digits their
    numbers have. A glob whose only wildcard after ``fixed`` is ``*`` cannot: its literal pieces hold no
    digit, so they only ever match outside the digit runs, which are the same text in every member.
    A ``?`` counts characters, and regexes are not analysed further (``.`` / ``\\d`` count too)."""
    n = min(len(lit), len(fixed))
    if lit[:n] != fixed[:n]:
        return False
    if kind != "glob":
        return True
    rest = body[len(fixed):] if len(lit) >= len(fixed) else body[len(lit):]
    return "?" in rest


@lru_cache(maxsize=16)
def _parsed(excludes: tuple[ExcludeList, ...]) -> _Entries:
    return _Entries(excludes)


def module_names(g: TensorGroup, subs: Iterable[tuple[int, ...]]) -> list[str]:
    slots = g.module.count("{}")
    if not slots:
        return [g.module]
    lead = [g.index] if g.index is not None else []
    return [g.module.format(*(lead + list(sub))[:slots]) for sub in subs]


def members_to_ask(g: TensorGroup, excludes: Sequence[ExcludeList],
                   renames: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Module names of the members of ``g`` whose answers stand for every member (all of them when an
    exclude entry may tell members apart, else one per digit-count signature), in sub-index order."""
    return [name for name, _ in weighted_members(g, excludes, renames)]


def weighted_members(g: TensorGroup, excludes: Sequence[ExcludeList],
                     renames: Sequence[tuple[str, str]] = ()) -> list[tuple[str, int]]:
    """(member module name, how many members its answer stands for) for the members to ask."""
    shown = g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module
    cut = shown.find("{}")
    if cut < 0 or len(g.subs) <= 1:
        return [(name, 1) for name in module_names(g, sorted(g.sub_indices))]
    prefixes = [shown[:cut]]
    for source, target in renames:
        if prefixes[0].startswith(source):
            prefixes.append(target + prefixes[0][len(source):])
        elif source.startswith(prefixes[0]):
            prefixes = []  # a rename reaching into the varying part: ask everyone
            break
    index = _parsed(tuple(excludes))
    verdicts = [index.classify(fixed) for fixed in prefixes]
    if not prefixes or any(distinguishing for distinguishing, _ in verdicts):
        return [(name, 1) for name in module_names(g, sorted(g.sub_indices))]
    if not any(sensitive for _, sensitive in verdicts):
        first = min(g.subs)  # members are distinct, one sub-index (int or tuple) each
        return [(module_names(g, [first if isinstance(first, tuple) else (first,)])[0], len(g.subs))]
    if isinstance(g.subs[0], int):  # one numeric segment (expert ids): digit counts by bisection
        values = sorted(set(g.subs))
        out, i = [], 0
        while i < len(values):
            j = bisect.bisect_left(values, 10 ** len(str(values[i])), i)
            out.append((module_names(g, [(values[i],)])[0], j - i))
            i = j
        return out
    first: dict[tuple[int, ...], tuple[int, ...]] = {}
    count: dict[tuple[int, ...], int] = {}
    for sub in sorted(g.sub_indices):
        signature = tuple(len(str(v)) for v in sub)
        first.setdefault(signature, sub)
        count[signature] = count.get(signature, 0) + 1
    return list(zip(module_names(g, first.values()), count.values()))
