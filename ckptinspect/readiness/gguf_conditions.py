"""Conditions of kind ``gguf`` (rules/engines/llamacpp.yaml ``verdicts``) and the facts they see.

``GgufHeadFacts`` is what one engine version sees of a GGUF checkpoint's NextN head: the
architecture, where the head is, whether this engine version drafts with the architecture, and the
head's lowest-precision weight type. Versions are llama.cpp build tags (``b9180``); ranges are
comma-separated comparisons (``>=b9180,<b11058``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptinspect.errors import RuleError
from ckptinspect.header.gguf_types import GGML_TYPE_BY_NAME
from ckptinspect.rules.conditions import register_all

_RANGE = re.compile(r"^\s*(>=|<=|>|<|==)\s*b(\d+)\s*$")


@dataclass(frozen=True)
class GgufHeadFacts:
    arch: str
    head: str  # inside | companion | missing | undeclared | none
    drafted: bool  # this engine version drafts with the architecture's NextN head
    lowest_bits: float | None  # bits per weight of the head's lowest-precision quantized weight
    version: str  # engine build, e.g. "b11058"


def build_number(version: str) -> int:
    m = re.fullmatch(r"b(\d+)", version.strip())
    if m is None:
        raise RuleError(f"llama.cpp version {version!r} is not a build tag like b9180", path="rules/engines/llamacpp.yaml")
    return int(m.group(1))


def version_in(version: str, ranges: str) -> bool:
    """``b10795`` in ``>=b9180,<b11058``: every comparison holds."""
    build = build_number(version)
    for part in ranges.split(","):
        m = _RANGE.match(part)
        if m is None:
            raise RuleError(f"version range {ranges!r} is not like '>=b9180,<b11058'", path="rules/engines/llamacpp.yaml")
        op, other = m.group(1), int(m.group(2))
        ok = {">=": build >= other, "<=": build <= other, ">": build > other, "<": build < other,
              "==": build == other}[op]
        if not ok:
            return False
    return True


def _head_below(facts: GgufHeadFacts, type_name: str) -> bool:
    ref = GGML_TYPE_BY_NAME.get(type_name)
    if ref is None:
        raise RuleError(f"head_below names unknown ggml type {type_name!r}", path="rules/engines/llamacpp.yaml")
    return facts.lowest_bits is not None and facts.lowest_bits < ref.bits


register_all("gguf", {
    "arch": lambda f, archs: f.arch in archs,
    "head": lambda f, places: f.head in places,
    "drafted": lambda f, flag: f.drafted is bool(flag),
    "head_below": _head_below,
    "version": lambda f, ranges: version_in(f.version, ranges),
})
