"""The one YAML loader for rule files (family rules, GPU catalog, engine rules): bounded in size, depth and
time, and without anchors or aliases.

Rule files can come from anyone (``--rules-dir``). YAML aliases let a few hundred bytes stand for an
exponentially large tree (each level refers twice to the one below) or for a recursive one (an anchor
used inside itself), which hangs the consumer, dies with a RecursionError, or is written expanded
into the validation cache. Rule files never need them, so they are refused (a merge key without an alias only merges an inline mapping): the
document is first read as a stream of parser events (libyaml's parser is iterative, so a deep or odd
document cannot exhaust the stack here), which must hold no anchor, no alias, and nest at most
MAX_DEPTH levels; only then is it composed by PyYAML's safe loader.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from ckptinspect.errors import RuleError

MAX_RULE_FILE_BYTES = 1024 * 1024  # the largest built-in rule file is ~52 KB (rules/engines/architectures.yaml)
MAX_DEPTH = 64  # the deepest built-in rule document nests 9 levels


def read_rule_bytes(path: Path, *, max_bytes: int = MAX_RULE_FILE_BYTES) -> bytes:
    """The bytes of a rule file: a regular file of at most ``max_bytes`` (checked before reading)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    except OSError as exc:
        raise RuleError(f"cannot read rule file: {exc.strerror}", path=str(path)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RuleError("cannot read rule file: not a regular file", path=str(path))
        if info.st_size > max_bytes:
            raise RuleError(f"rule file is {info.st_size:,} bytes, over the {max_bytes:,} byte limit",
                            path=str(path))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise RuleError(f"cannot read rule file: {exc.strerror}", path=str(path)) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise RuleError(f"rule file is over the {max_bytes:,} byte limit", path=str(path))
    return data


def load_rule_yaml(data: bytes, path: str | Path) -> Any:
    """Parse a rule file's bytes; every problem is a one-line RuleError naming ``path``."""
    import yaml  # ~70 ms to import: only when a rule file is actually parsed

    where = str(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RuleError(f"not UTF-8 text ({exc.reason})", path=where) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _check_events(yaml, yaml.parse(text, Loader=loader), where)
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise RuleError(f"{at}invalid YAML: {problem}", path=where) from None


def _check_events(yaml: Any, events: Any, where: str) -> None:
    depth = 0
    for event in events:
        if isinstance(event, yaml.AliasEvent):
            raise RuleError(f"{_at(event)}YAML aliases (*name) are not allowed in rule files", path=where)
        if getattr(event, "anchor", None) is not None:
            raise RuleError(f"{_at(event)}YAML anchors (&name) are not allowed in rule files", path=where)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise RuleError(f"{_at(event)}nested deeper than {MAX_DEPTH} levels", path=where)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _at(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
