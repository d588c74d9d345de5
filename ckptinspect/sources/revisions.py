"""Revisions as the Hub accepts them: a 40-hex commit, or a git branch / tag name (``main``, ``v1.0``,
``refs/pr/1``), checked with git's ``check-ref-format`` rules before a revision is ever joined into a
path (``refs/<revision>`` of the HF cache) or a URL. ``../../dev/zero`` is not a name git or the Hub
allows, so it is refused with one line instead of being read."""

from __future__ import annotations

import re

from ckptinspect.errors import SourceError

COMMIT = re.compile(r"[0-9a-f]{40}")
MAX_REVISION_CHARS = 255  # the longest file name most file systems hold (refs/<name> is one file)
# git check-ref-format (refs.c check_refname_component): no control characters, no space, ~ ^ : ? * [ \
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


class RevisionError(SourceError):
    """A revision that is neither a commit hash nor a valid branch / tag name."""


def check_revision(revision: str) -> str:
    """``revision`` when valid, else RevisionError naming the problem."""
    if COMMIT.fullmatch(revision):
        return revision
    problem = _problem(revision)
    if problem:
        shown = revision.encode("unicode_escape").decode("ascii")[:80]
        raise RevisionError(f"revision {shown!r} is not a branch, tag or 40-hex commit ({problem})",
                            hint="revisions follow git's ref-name rules, as on the Hub")
    return revision


def _problem(revision: str) -> str:
    if not revision:
        return "empty"
    if len(revision) > MAX_REVISION_CHARS:
        return f"longer than {MAX_REVISION_CHARS} characters"
    if _FORBIDDEN.search(revision):
        return "holds a space, a control character or one of ~ ^ : ? * [ \\"
    if revision == "@" or "@{" in revision:
        return "holds '@{'"
    if revision.startswith("/") or revision.endswith(("/", ".")) or "//" in revision:
        return "starts or ends with '/', ends with '.', or holds '//'"
    for part in revision.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return "a path segment starts with '.' or ends with '.lock'"
    return ""
