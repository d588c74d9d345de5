"""Which members of a tensor group must be asked about the exclude lists, exactly.

The members of a group (e.g. the 256 routed experts of an MTP layer) differ only in the digits of
their numeric segments. An exclude entry that has no digit, character class or similar construct in
the part that can reach those segments cannot tell two members apart whose numbers have the same
digit counts: glob ``*`` / ``?`` and regex ``.``, ``\\d``, ``\\w``, quantifiers without counts treat
every digit alike. So unless some entry may distinguish members, one member per digit-count
signature answers for all of them; otherwise every member is asked. tests/test_verdict_invariant.py
checks the shortcut against asking every member.
"""

from __future__ import annotations

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


@lru_cache(maxsize=16)
def _parsed(excludes: tuple[ExcludeList, ...]) -> tuple[tuple[str, str, str], ...]:
    """(body, kind, literal head) of every entry, computed once per distinct set of lists."""
    return tuple((body, kind, body if kind == "exact" else _literal(body, _GLOB_META if kind == "glob" else _REGEX_META))
                 for body, kind in _entries(excludes))


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
    subs = sorted(g.sub_indices)
    shown = g.module.replace("{}", str(g.index), 1) if g.index is not None else g.module
    cut = shown.find("{}")
    if len(subs) <= 1 or cut < 0:
        return module_names(g, subs)
    prefixes = [shown[:cut]]
    for source, target in renames:
        if prefixes[0].startswith(source):
            prefixes.append(target + prefixes[0][len(source):])
        elif source.startswith(prefixes[0]):
            return module_names(g, subs)  # a rename reaching into the varying part
    entries = _parsed(tuple(excludes))
    if any(may_distinguish(body, kind, fixed, lit) for fixed in prefixes for body, kind, lit in entries):
        return module_names(g, subs)
    seen: dict[tuple[int, ...], tuple[int, ...]] = {}
    for sub in subs:
        seen.setdefault(tuple(len(str(v)) for v in sub), sub)
    return module_names(g, seen.values())
