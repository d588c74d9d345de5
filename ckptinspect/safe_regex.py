"""Patterns from strangers (checkpoint configs, rule files) evaluated in linear time.

Python's ``re`` backtracks: ``(a|a)*b`` or ``((ab)*a)*c`` against a long name runs for ever, and no
syntactic screen catches every such pattern. So untrusted patterns run on RE2 (``google-re2``, imported
as ``re2``), whose matching time is linear in the name. The exporters and engines define the meaning
with Python's ``re.match``, so a pattern is first compiled by Python (it must be valid there), then
translated to RE2 syntax with the same answers:

- ``$`` (no MULTILINE) also matches before a final newline in Python: ``(?:\\n?\\z)`` in RE2; ``\\Z`` is
  RE2's ``\\z``; ``x{,n}`` is ``x{0,n}`` (RE2 reads it literally).
- ``\\d``, ``\\w``, ``\\s`` are Unicode classes in Python's str patterns and ASCII in RE2: spelled out as
  ``\\p{Nd}``, ``[\\p{L}\\p{N}_]`` and the exact set of ``str.isspace`` characters.
- What RE2 cannot evaluate, or evaluates differently, raises :class:`UnsupportedPattern` (the caller
  makes it a finding, never a guess): look-arounds, backreferences, ``\\b`` / ``\\B`` (Unicode word
  boundaries), MULTILINE / VERBOSE / ASCII / LOCALE flags, atomic groups, possessive repeats,
  ``\\W`` / ``\\S`` inside a set, POSIX-looking ``[:`` inside a set, and patterns over RE2's memory cap.

Known residual difference (docs/security.md): letters and digits added to Unicode after the version
Python's ``unicodedata`` knows may be ``\\w`` / ``\\d`` for RE2 only; real tensor names are ASCII.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any

from ckptinspect.errors import CkptInspectError

MAX_PATTERN_CHARS = 1000
RE2_MAX_MEM = 64 << 20  # bytes RE2 may use for one compiled pattern (a 184-entry exclude list needs ~1 MB)

# Characters for which str.isspace() is true: Python's \s in a str pattern (tests check the set).
_SPACE = r"\t-\r\x1c-\x20\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
_WORD = r"\p{L}\p{N}_"
_OUTSIDE = {"d": r"\p{Nd}", "D": r"\P{Nd}", "w": f"[{_WORD}]", "W": f"[^{_WORD}]", "s": f"[{_SPACE}]",
            "S": f"[^{_SPACE}]"}
_INSIDE = {"d": r"\p{Nd}", "D": r"\P{Nd}", "w": _WORD, "s": _SPACE}
_SIMPLE_ESCAPES = set("aftnrv")  # the same character in both engines
_OPEN_REPEAT = re.compile(r"\{,(\d+)\}")
_FLAGS = re.compile(r"\(\?([a-zA-Z]+)(?:-([a-zA-Z]+))?[:)]")


class UnsupportedPattern(CkptInspectError, ValueError):
    """A pattern RE2 cannot evaluate with Python's answers; ``str()`` says why (callers that can go on
    make it a finding; elsewhere it is the CLI's one-line error)."""


def _re2() -> Any:
    import re2  # google-re2

    return re2


# translate() answers by pattern, exceptions included: an exclude list's entries are asked again for every
# engine and module kind (13 times per report), and re-deriving 100,000 entries each time took a minute.
# Bounded: a report holds at most a few lists of MAX_LIST_PATTERNS evaluated entries each.
_TRANSLATED: dict[str, str | UnsupportedPattern] = {}
_TRANSLATED_MAX = 1 << 18
# Regex / wildcard entries of one list that are evaluated (real lists: 10 to ~1,000 entries). A longer
# list is never guessed at: its lookups raise UnsupportedPattern (the caller's "not evaluated" finding),
# so a hostile 100,000-entry list costs a second, not a minute per command.
MAX_LIST_PATTERNS = 10_000


def _python_parses(pattern: str) -> None:
    """Python's verdict on ``pattern`` (re.error etc.). Parsing alone (``re._parser``) gives every error
    ``re.compile`` gives except look-behind width, which only the compiler checks: a pattern with a
    look-behind is compiled (RE2 refuses look-arounds anyway). Parsing is ~5x cheaper than compiling."""
    parser = getattr(re, "_parser", None)
    with warnings.catch_warnings():  # a stranger's pattern must not print FutureWarnings
        warnings.simplefilter("ignore")
        if parser is None or "(?<" in pattern:
            re.compile(pattern)
        else:
            parser.parse(pattern)


def translate(pattern: str) -> str:
    """The RE2 pattern with the match answers of Python's ``re`` for ``pattern``.

    Raises:
        UnsupportedPattern: too long, invalid for Python, or using a construct listed in the module docstring.
    """
    known = _TRANSLATED.get(pattern)
    if known is None:
        try:
            known = _translate(pattern)
        except UnsupportedPattern as exc:
            known = exc
        if len(_TRANSLATED) >= _TRANSLATED_MAX:
            _TRANSLATED.clear()
        _TRANSLATED[pattern] = known
    if isinstance(known, UnsupportedPattern):
        raise UnsupportedPattern(str(known))
    return known


def _translate(pattern: str) -> str:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsupportedPattern(f"longer than {MAX_PATTERN_CHARS} characters")
    try:
        _python_parses(pattern)  # parsing is linear; only matching backtracks
    except re.error as exc:
        raise UnsupportedPattern(f"invalid regex: {exc}") from None
    except (OverflowError, RecursionError, ValueError) as exc:  # huge repeat counts, deep nesting
        raise UnsupportedPattern(f"invalid regex: {type(exc).__name__}") from None
    for flags in _FLAGS.finditer(pattern):
        bad = set(flags.group(1) + (flags.group(2) or "")) - set("is")
        if bad and not pattern[max(0, flags.start() - 1):flags.start()] == "\\":
            raise UnsupportedPattern(f"inline flag(s) {''.join(sorted(bad))!r}")
    out: list[str] = []
    i, n = 0, len(pattern)
    in_set = set_start = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            i = _escape(pattern, i, in_set, out)
            set_start = False
            continue
        if in_set:
            if c == "]" and not set_start:
                in_set = False
                out.append("]")
            elif c == "[":
                if pattern.startswith("[:", i) or pattern.startswith("[=", i) or pattern.startswith("[.", i):
                    raise UnsupportedPattern("'[:' inside a set (RE2 reads a POSIX class there)")
                out.append(r"\[")
            elif c == "]":  # first in the set: a literal in Python
                out.append(r"\]")
            else:
                out.append(c)
            set_start = False
            i += 1
            continue
        if c == "[":
            in_set = set_start = True
            out.append("[")
            if pattern.startswith("^", i + 1):
                out.append("^")
                i += 1
        elif c == "$":
            out.append(r"(?:\n?\z)")
        elif c == "{" and _OPEN_REPEAT.match(pattern, i):
            m = _OPEN_REPEAT.match(pattern, i)
            out.append(f"{{0,{m.group(1)}}}")
            i = m.end()
            continue
        elif c == "(" and pattern.startswith("(?", i):
            if pattern.startswith("(?>", i):
                raise UnsupportedPattern("atomic group")
            out.append(c)
        elif c in "*+?}" and i + 1 < n and pattern[i + 1] == "+" and _is_repeat_end(pattern, i):
            raise UnsupportedPattern("possessive repeat")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _is_repeat_end(pattern: str, i: int) -> bool:
    return pattern[i] != "}" or re.search(r"\{\d*,?\d*\}$", pattern[:i + 1]) is not None


def _escape(pattern: str, i: int, in_set: bool, out: list[str]) -> int:
    """Translate the escape at ``pattern[i]`` (a backslash); return the index after it."""
    e = pattern[i + 1]  # Python rejected a trailing backslash already
    if e in "dDwWsS":
        table = _INSIDE if in_set else _OUTSIDE
        if e not in table:
            raise UnsupportedPattern(f"\\{e} inside a set")
        out.append(table[e])
        return i + 2
    if e == "Z" and not in_set:
        out.append(r"\z")
        return i + 2
    if e == "A" and not in_set:
        out.append(r"\A")
        return i + 2
    if e in "bB":
        raise UnsupportedPattern(f"\\{e} (Unicode word boundary)")
    if e.isdigit():
        raise UnsupportedPattern("backreference or octal escape")
    if e == "x":
        code = int(pattern[i + 2:i + 4], 16)
        out.append(f"\\x{{{code:x}}}")
        return i + 4
    if e in "uU":
        width = 4 if e == "u" else 8
        code = int(pattern[i + 2:i + 2 + width], 16)
        out.append(f"\\x{{{code:x}}}")
        return i + 2 + width
    if e in _SIMPLE_ESCAPES:
        out.append("\\" + e)
        return i + 2
    if e.isascii() and e.isalnum():  # \N{...} and anything else RE2 reads otherwise
        raise UnsupportedPattern(f"escape \\{e}")
    out.append(_literal(e))
    return i + 2


def _literal(ch: str) -> str:
    if ch.isascii():
        return ch if ch.isalnum() or ch == "_" else "\\" + ch
    return f"\\x{{{ord(ch):x}}}"


_GLOBS: dict[str, str | UnsupportedPattern] = {}


def translate_glob(glob: str) -> str:
    """The RE2 pattern of an ``fnmatch.fnmatchcase`` glob (``*`` and ``?`` match any character, newlines
    included; a set of plain name characters; everything else literal), without anchors."""
    known = _GLOBS.get(glob)
    if known is None:
        try:
            known = _translate_glob(glob)
        except UnsupportedPattern as exc:
            known = exc
        if len(_GLOBS) >= _TRANSLATED_MAX:
            _GLOBS.clear()
        _GLOBS[glob] = known
    if isinstance(known, UnsupportedPattern):
        raise UnsupportedPattern(str(known))
    return known


def _translate_glob(glob: str) -> str:
    if len(glob) > MAX_PATTERN_CHARS:
        raise UnsupportedPattern(f"longer than {MAX_PATTERN_CHARS} characters")
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if not out or out[-1] != "(?s:.*)":  # ** is *
                out.append("(?s:.*)")
        elif c == "?":
            out.append("(?s:.)")
        elif c == "[":
            j = i + 1 if glob[i:i + 1] == "!" else i
            j += 1 if glob[j:j + 1] == "]" else 0  # a "]" first in the set is a member
            end = glob.find("]", j)
            if end < 0:  # no closing bracket: a literal "[" (fnmatch.translate)
                out.append(r"\[")
                continue
            body = glob[i:end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            ranges = re.findall(r"([A-Za-z0-9_.])-([A-Za-z0-9_.])", body)
            if not re.fullmatch(r"(?:[A-Za-z0-9_.]-[A-Za-z0-9_.]|[A-Za-z0-9_.])+", body) or any(a > b for a, b in ranges):
                raise UnsupportedPattern(f"glob set [{glob[i:end]}] (only name characters and ranges)")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = end + 1
        else:
            out.append(_literal(c))
    return "".join(out)


def compile_re2(pattern: str) -> Any:
    """Compile an RE2 pattern (from :func:`translate` / :func:`translate_glob`), quietly."""
    re2 = _re2()
    options = re2.Options()
    options.log_errors = False
    options.max_mem = RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise UnsupportedPattern(f"RE2 cannot evaluate it: {detail}") from None


def compile_re2_match_set(patterns: list[str]) -> Any:
    """An RE2 set of RE2 patterns (from :func:`translate`) anchored at the start like ``re.match``;
    ``.Match(text)`` gives the indices of every pattern that matches (None for none), so the first
    matching entry of a long ordered list is found in one linear-time pass."""
    re2 = _re2()
    options = re2.Options()
    options.log_errors = False
    options.max_mem = RE2_MAX_MEM
    matcher = re2.Set.MatchSet(options)
    try:
        for pattern in patterns:
            matcher.Add(pattern)
        matcher.Compile()
    except re2.error as exc:
        raise UnsupportedPattern(f"RE2 cannot evaluate it: {exc}") from None
    return matcher


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    return compile_re2(translate(pattern))


def match(pattern: str, text: str) -> bool:
    """``re.match(pattern, text) is not None``, in linear time (raises UnsupportedPattern)."""
    return _compiled(pattern).match(text) is not None


def search(pattern: str, text: str) -> bool:
    """``re.search(pattern, text) is not None``, in linear time (raises UnsupportedPattern)."""
    return _compiled(pattern).search(text) is not None


SET_CHUNK = 2048  # patterns per RE2 set: one set of 100,000 patterns fails to compile


@functools.lru_cache(maxsize=64)
def _match_sets(bodies: tuple[str, ...], globs: bool = False) -> tuple[Any, ...] | UnsupportedPattern:
    """RE2 sets of ``bodies`` (``re.match`` patterns, or with ``globs`` whole-name fnmatch globs) in chunks
    of SET_CHUNK, in order; a failure is returned, not raised, so it is cached like a success (a list is
    asked about many times)."""
    if len(bodies) > MAX_LIST_PATTERNS:
        return UnsupportedPattern(f"{len(bodies):,} {'wildcard' if globs else 'regex'} entries in one list, over "
                                  f"the {MAX_LIST_PATTERNS:,} evaluated")
    try:
        unique = {b: (translate_glob(b) + r"\z" if globs else translate(b)) for b in dict.fromkeys(bodies)}
        ordered = [unique[b] for b in bodies]
        return tuple(compile_re2_match_set(ordered[start:start + SET_CHUNK])
                     for start in range(0, len(ordered), SET_CHUNK))
    except UnsupportedPattern as exc:
        return exc


def first_match_index(text: str, bodies: tuple[str, ...]) -> int | None:
    """The index of the first of ``bodies`` (Python ``re.match`` patterns, in list order) that matches at
    the start of ``text``, None for none: the list is compiled into RE2 sets once and each text is matched
    against all of them in one linear-time pass per set (raises UnsupportedPattern: an entry RE2 cannot
    evaluate, or more than MAX_LIST_PATTERNS entries)."""
    return _first_index(text, _match_sets(bodies))


def first_glob_match_index(text: str, globs: tuple[str, ...]) -> int | None:
    """The index of the first of ``globs`` that ``fnmatch.fnmatchcase(text, glob)`` accepts, None for
    none, as ``first_match_index`` does it (raises UnsupportedPattern)."""
    return _first_index(text, _match_sets(globs, True))


def _first_index(text: str, sets: tuple[Any, ...] | UnsupportedPattern) -> int | None:
    if isinstance(sets, UnsupportedPattern):
        raise UnsupportedPattern(str(sets))
    for chunk, matcher in enumerate(sets):
        hits = matcher.Match(text)
        if hits:
            return chunk * SET_CHUNK + min(hits)
    return None


def python_accepts(pattern: str) -> bool:
    """Whether Python's ``re`` compiles ``pattern``: the engines skip a config key it rejects (``except
    re.error: continue``). Compiling only parses, in linear time; matching is what runs on RE2."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError):
        return False
    return True
