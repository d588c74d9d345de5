"""MTP prefix templates -> matchers over group patterns.

Grammar: literal text plus ``{L}`` (num_hidden_layers), ``{k}`` (the MTP index, captured),
``{L+k}`` (an index >= L; k = index - L), ``{*}`` (any index that is not the MTP index).
A template without ``{k}`` assigns k = 0. Numeric segments of a group pattern are ``{}`` slots;
only the first slot (the group's ``index``) may carry a constraint, because every MTP layout
known puts the MTP index first (``model.layers.61.``, ``mtp.layers.0.``, ``model.mtp_layers.0.``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptinspect.errors import RuleError

_TOKEN = re.compile(r"\{(L\+k|L|k|\*)\}|\.(\d+)(?=\.|$)")


@dataclass(frozen=True)
class MtpPrefix:
    template: str
    prefix: str  # the template with slots as "{}" (comparable with group patterns)
    first_slot: str  # "" (no slot) | "k" | "L+k" | "eq" | "any"
    value: int  # the literal for "eq"

    def match(self, pattern: str, index: int | None, layers: int) -> int | None:
        """The MTP index k when a group (pattern, index) lies under this prefix, else None."""
        if not pattern.startswith(self.prefix):
            return None
        slot = self.first_slot
        if slot == "" or slot == "any":
            return 0
        if index is None:
            return None
        if slot == "k":
            return index
        if slot == "L+k":
            return index - layers if index >= layers else None
        return 0 if index == self.value else None

    def concrete(self, layers: int, k: int) -> str:
        """The literal prefix of MTP layer k (for messages)."""
        return (self.template.replace("{L+k}", str(layers + k)).replace("{k}", str(k))
                .replace("{L}", str(layers)).replace("{*}", "N"))


def compile_prefixes(templates: tuple[str, ...], layers: int) -> tuple[MtpPrefix, ...]:
    """Compile templates, resolving ``{L}`` with the checkpoint's num_hidden_layers."""
    compiled = []
    for template in templates:
        slots: list[tuple[str, int]] = []

        def to_slot(match: re.Match[str]) -> str:
            token, digits = match.group(1), match.group(2)
            if digits is not None:
                slots.append(("eq", int(digits)))
                return ".{}"
            if token == "L":
                slots.append(("eq", layers))
            elif token == "*":
                slots.append(("any", 0))
            else:
                slots.append((token, 0))
            return "{}"

        prefix = _TOKEN.sub(to_slot, template)
        if any(kind in ("k", "L+k", "eq") for kind, _ in slots[1:]):
            raise RuleError(f"MTP prefix template '{template}': only the first index may be the MTP index "
                            "or a fixed value")
        first_kind, value = slots[0] if slots else ("", 0)
        compiled.append(MtpPrefix(template, prefix, first_kind, value))
    return tuple(compiled)


def assign_mtp(pattern: str, index: int | None, prefixes: tuple[MtpPrefix, ...], layers: int) -> int | None:
    """The MTP layer of a group: the first template that matches decides."""
    for prefix in prefixes:
        k = prefix.match(pattern, index, layers)
        if k is not None:
            return k
    return None
