"""MTP prefix templates: the small grammar rule files use to name where an MTP layer lives.

Grammar (shared with ``inventory.build``, which assigns ``TensorGroup.mtp_layer``):
literal text plus ``{L}`` (num_hidden_layers), ``{k}`` (MTP index, captured), ``{L+k}``
(an index >= L; k = index - L) and ``{*}`` (any index, not the MTP index). A template
without ``{k}`` assigns k = 0. Lists are ordered most specific first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Used when no family rule matched (unknown architecture): every prefix an engine is known to
# load MTP weights from (mtp_families.md §2-§3; vLLM `get_spec_layer_idx_from_weight_name`
# prefixes for the DeepSeek path, Qwen `mtp.`, MiMo, MiMo-V2 / LongCat `model.mtp.`, ERNIE).
GENERIC_MTP_PREFIXES: tuple[str, ...] = (
    "model.layers.{L+k}.",
    "model.language_model.layers.{L+k}.",
    "language_model.model.layers.{L+k}.",
    "mtp.layers.{k}.",
    "mtp.",
    "model.mtp_layers.{k}.",
    "model.mtp.layers.{k}.",
    "model.mtp.",
    "model.mtp_block.{k}.",
    "model.mtp_emb_norm.{k}.",
    "model.mtp_hidden_norm.{k}.",
    "model.mtp_linear_proj.{k}.",
)

_TOKEN = re.compile(r"\{(L\+k|L|k|\*)\}")


def check_template(template: str) -> str | None:
    """Return an error message when ``template`` is not valid grammar, else None."""
    rest = _TOKEN.sub("", template)
    if "{" in rest or "}" in rest:
        return f"unknown placeholder in {template!r} (allowed: {{L}}, {{k}}, {{L+k}}, {{*}})"
    tokens = _TOKEN.findall(template)
    if tokens.count("k") + tokens.count("L+k") > 1:
        return f"{template!r} captures the MTP index twice"
    return None


@dataclass(frozen=True)
class CompiledPrefix:
    """One template compiled for concrete tensor names and for inventory patterns."""

    template: str
    name_regex: re.Pattern[str]  # matches concrete names, group "k" / "lk" capture the index
    pattern_regex: re.Pattern[str]  # matches TensorGroup.pattern (numbers already "{}")
    placeholders: int  # dotted numeric segments the prefix consumes

    def mtp_index(self, name: str, num_layers: int) -> int | None:
        """The MTP index k when ``name`` starts with this prefix, else None."""
        m = self.name_regex.match(name)
        if m is None:
            return None
        if m.group("lk") is not None:
            value = int(m.group("lk"))
            return value - num_layers if value >= num_layers else None
        if m.group("k") is not None:
            return int(m.group("k"))
        return 0


def compile_prefix(template: str, num_layers: int) -> CompiledPrefix:
    """Compile ``template`` for a checkpoint with ``num_layers`` decoder layers."""
    name_parts: list[str] = []
    pattern_parts: list[str] = []
    placeholders = 0
    pos = 0
    has_k = False
    for m in _TOKEN.finditer(template):
        literal = template[pos:m.start()]
        name_parts.append(re.escape(literal))
        pattern_parts.append(re.escape(literal))
        token = m.group(1)
        if token == "L":
            name_parts.append(str(num_layers))
        elif token == "k":
            name_parts.append(r"(?P<k>\d+)")
            has_k = True
        elif token == "L+k":
            name_parts.append(r"(?P<lk>\d+)")
            has_k = True
        else:
            name_parts.append(r"\d+")
        pattern_parts.append(r"\{\}")
        placeholders += 1
        pos = m.end()
    name_parts.append(re.escape(template[pos:]))
    pattern_parts.append(re.escape(template[pos:]))
    name_src = "".join(name_parts)
    if not has_k:
        name_src += r"(?P<k>(?!))?(?P<lk>(?!))?"  # keep both groups defined
    elif "(?P<k>" not in name_src:
        name_src += r"(?P<k>(?!))?"
    elif "(?P<lk>" not in name_src:
        name_src += r"(?P<lk>(?!))?"
    return CompiledPrefix(template, re.compile(name_src), re.compile("".join(pattern_parts)), placeholders)


def concrete_prefix(template: str, num_layers: int, k: int) -> str:
    """The prefix of MTP layer ``k`` (``{*}`` must not occur: it names no single layer)."""
    out = template.replace("{L+k}", str(num_layers + k)).replace("{L}", str(num_layers))
    return out.replace("{k}", str(k))


def mtp_index_of(name: str, prefixes: tuple[CompiledPrefix, ...], num_layers: int) -> int | None:
    """The MTP index of a concrete tensor name under the first matching prefix, else None."""
    for prefix in prefixes:
        if prefix.name_regex.match(name):
            return prefix.mtp_index(name, num_layers)
    return None
