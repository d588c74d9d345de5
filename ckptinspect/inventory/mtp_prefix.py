"""MTP prefix templates: the small grammar rule files use to name where an MTP layer lives.

Grammar: literal text plus ``{L}`` (num_hidden_layers), ``{k}`` (the MTP index, captured),
``{L+k}`` (an index >= L; k = index - L), ``{*}`` (any index that is not the MTP index).
A template without ``{k}`` assigns k = 0. Lists are ordered most specific first. Numeric segments
of a group pattern are ``{}`` slots; only the first slot (the group's ``index``) may carry a
constraint, because every MTP layout known puts the MTP index first (``model.layers.61.``,
``mtp.layers.0.``, ``model.mtp_layers.0.``). The one implementation: the rule loader checks
templates with ``check_template``, the inventory matches group patterns with ``compile_prefixes``,
the readiness stage names concrete prefixes with ``concrete_prefix``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptinspect.errors import RuleError

_TOKEN = re.compile(r"\{(L\+k|L|k|\*)\}|\.(\d+)(?=\.|$)")
_PLACEHOLDER = re.compile(r"\{(L\+k|L|k|\*)\}")

# Used when no family rule matched (unknown architecture): every prefix an engine is known to
# load MTP weights from (mtp_families.md §2-§3; vLLM `get_spec_layer_idx_from_weight_name`
# prefixes for the DeepSeek path, Qwen `mtp.`, MiMo / HY V4 `model.mtp_layers.`, MiMo-V2 / LongCat /
# Inkling `model.mtp.`, MiniMax-M3 VL `language_model.model.mtp.`, Nemotron-H VLM `language_model.mtp.`,
# ERNIE). Indexed templates come before the bare prefix they extend, so the MTP index is captured.
GENERIC_MTP_PREFIXES: tuple[str, ...] = (
    "model.layers.{L+k}.",
    "model.language_model.layers.{L+k}.",
    "language_model.model.layers.{L+k}.",
    "mtp.layers.{k}.",
    "mtp.",
    "model.mtp_layers.{k}.",
    "model.mtp.layers.{k}.",
    "model.mtp.",
    "language_model.model.mtp.layers.{k}.",
    "language_model.model.mtp.",
    "language_model.mtp.layers.{k}.",
    "language_model.mtp.",
    "model.mtp_block.{k}.",
    "model.mtp_emb_norm.{k}.",
    "model.mtp_hidden_norm.{k}.",
    "model.mtp_linear_proj.{k}.",
)


def check_template(template: str) -> str | None:
    """Why ``template`` is not valid grammar, or None (the rule loader reports it as a RuleError)."""
    rest = _PLACEHOLDER.sub("", template)
    if "{" in rest or "}" in rest:
        return f"unknown placeholder in {template!r} (allowed: {{L}}, {{k}}, {{L+k}}, {{*}})"
    try:
        compile_prefixes((template,), 1)
    except RuleError as exc:
        return str(exc)
    return None


def concrete_prefix(template: str, layers: int, k: int) -> str:
    """The literal prefix of MTP layer ``k`` (``{*}``, which names no single layer, reads ``N``)."""
    return (template.replace("{L+k}", str(layers + k)).replace("{k}", str(k))
            .replace("{L}", str(layers)).replace("{*}", "N"))


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
        return concrete_prefix(self.template, layers, k)


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
            raise RuleError(f"MTP prefix template {template!r}: only the first index may be the MTP index "
                            "or a fixed value (a second {k} / {L+k} captures it twice)")
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
