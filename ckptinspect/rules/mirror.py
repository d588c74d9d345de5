"""A JSON mirror of the built-in rule files, read instead of their YAML when the bytes are unchanged.

Every report reads ~54 built-in rule files through the safe YAML loader (safe_yaml.py); what the
mirror saves is measured in BENCHMARKS.md. ``mirror.jsonl`` in the rules folder holds, per built-in
file, its path under the rules folder, the sha256 of its bytes and its parsed document. It is a build
output, never committed: the wheel build writes it (hatch_build.py), ``scripts/compile_rules.py`` writes
one into a source checkout, and without one every file is read from its YAML. The YAML files stay the
source of truth: a file is taken from the mirror only
when the sha256 of the bytes read now equals the mirrored one, so an edited, replaced or damaged file
is parsed from its YAML as before, never answered from an old copy. A document that JSON cannot hold
with the same Python types (a date, a non-string key) is left out of the mirror when it is written.
User rule files (``--rules-dir``) never go through the mirror.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec

from ckptinspect.errors import RuleError
from ckptinspect.safe_yaml import load_rule_yaml, read_rule_bytes

MIRROR = "mirror.jsonl"
MAX_MIRROR_BYTES = 16 * 1024 * 1024  # the built-in rules are ~250 KB of YAML
_decode = msgspec.json.Decoder().decode


def builtin_rule_document(path: Path, root: Path) -> Any:
    """The parsed built-in rule file ``path`` (under the rules folder ``root``): the mirrored document when
    the file's bytes still have the mirrored sha256, else the file's YAML through the safe loader."""
    data = read_rule_bytes(path)
    try:
        relative = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        relative = None
    entry = _entries(root).get(relative) if relative is not None else None
    if entry is not None and entry[0] == hashlib.sha256(data).hexdigest():
        return _decode(entry[1])["doc"]  # parsed per call: callers get objects of their own
    return load_rule_yaml(data, path)


@lru_cache(maxsize=4)
def _entries(root: Path) -> dict[str, tuple[str, bytes]]:
    """relative path -> (sha256, the mirror line); empty when the mirror is missing or unreadable (every
    file is then read from its YAML)."""
    path = root / MIRROR
    try:
        data = read_rule_bytes(path, max_bytes=MAX_MIRROR_BYTES)
    except RuleError:  # missing, not a regular file or oversized: the YAML files answer, as without one
        return {}
    entries: dict[str, tuple[str, bytes]] = {}
    for line in data.splitlines():
        try:
            record = _decode(line)
        except msgspec.DecodeError:
            return {}
        if not (isinstance(record, dict) and isinstance(record.get("path"), str)
                and isinstance(record.get("sha256"), str) and "doc" in record):
            return {}
        entries[record["path"]] = (record["sha256"], line)
    return entries


def mirror_lines(root: Path, files: list[Path]) -> list[bytes]:
    """The mirror of ``files`` (under ``root``), one JSON line each, in path order: what
    scripts/compile_rules.py writes. A document whose JSON round trip changes a value or a type is
    left out (that file is always read from its YAML)."""
    lines = []
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        data = read_rule_bytes(path)
        doc = load_rule_yaml(data, path)
        try:
            text = msgspec.json.encode({"path": path.relative_to(root).as_posix(),
                                        "sha256": hashlib.sha256(data).hexdigest(), "doc": doc})
        except TypeError:  # a value JSON cannot hold at all
            continue
        if same_values(_decode(text)["doc"], doc):  # a date or an int key comes back as a string: left out
            lines.append(text)
    return lines


def same_values(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (``1 == 1.0 == True`` in Python; not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same_values, a, b))
    return a == b
