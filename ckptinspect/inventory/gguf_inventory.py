"""GGUF tensor infos -> Inventory: groups by name pattern, components by llama.cpp's tensor names.

Names are llama.cpp's (gguf-py/gguf/constants.py ``TENSOR_NAMES``; src/llama-arch.cpp
``LLM_TENSOR_NAMES``): ``token_embd``, ``output``, ``output_norm``, ``blk.{bid}.attn_*``, ``ffn_*``,
``ffn_*_exps`` (all experts of a layer in one 3-D tensor), ``ffn_*_shexp``, ``ffn_gate_inp``, and for
NextN/MTP blocks ``blk.{bid}.nextn.{eh_proj, enorm, hnorm, embed_tokens, shared_head_head,
shared_head_norm}``. They are matched by pattern, not by the reader's per-architecture tables, which
lag the newest architectures (new ``nextn.*`` names land in a group of the MTP layer all the same).
Blocks ``>= block_count - nextn_predict_layers`` are MTP layers (``mtp_layer = bid - layers``).
Shapes are reported in row-major order (GGUF stores ``ne[0]`` first), like safetensors shapes.
"""

from __future__ import annotations

import re
from typing import Iterable

from ckptinspect.header.gguf import GgufHeader, GgufTensorInfo
from ckptinspect.records import Inventory, ShardInfo, TensorGroup, Totals

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_DIGITS = re.compile(r"(?<=\.)\d+(?=\.|$)")
NEXTN_PREFIX = "nextn."

# (component, kind) by the tensor's base name (the part after ``blk.N.`` without .weight/.bias), first match wins
_COMPONENTS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), c) for p, c in (
    (r"^nextn\.eh_proj$", "mtp_fusion"),
    (r"^nextn\.embed_tokens$", "embedding"),
    (r"^nextn\.shared_head_head$", "lm_head"),
    (r"^nextn\..*norm$", "norm"),
    (r"^nextn\.", "other"),
    (r"^token_embd$|^per_layer_token_embd$", "embedding"),
    (r"^output$", "lm_head"),
    (r"norm$|_norm_", "norm"),
    (r"^ffn_gate_inp$|^exp_probs_b$|^ffn_gate_inp_shexp$", "router"),
    (r"_exps$", "routed_expert"),
    (r"_shexp$", "shared_expert"),
    (r"^ffn_", "mlp"),
    (r"^attn_|^ssm_|^time_mix_|^indexer\.", "attention"),
))


def component_of(base: str) -> str:
    for pattern, component in _COMPONENTS:
        if pattern.search(base):
            return component
    return "other"


def _split_name(name: str) -> tuple[str, str]:
    """(base, role): ``blk.3.attn_q.weight`` -> (``attn_q``, ``weight``)."""
    m = _BLOCK.match(name)
    rest = m.group(2) if m else name
    for suffix in (".weight", ".bias", ".scale"):
        if rest.endswith(suffix):
            return rest[: -len(suffix)], suffix[1:]
    return rest, "other"


def build_gguf_inventory(parts: Iterable[tuple[str, GgufHeader]], layers: int) -> Inventory:
    groups: list[TensorGroup] = []
    shards: list[ShardInfo] = []
    for file, header in parts:
        shards.append(ShardInfo(name=file, header_length=header.header_bytes, file_size=header.file_size,
                                tensors=len(header.tensors), data_bytes=header.data_bytes))
        groups.extend(_group(t, file, layers) for t in header.tensors)
    groups.sort(key=lambda g: (g.index if g.index is not None else -1, g.pattern))
    totals = Totals(tensors=len(groups), params=sum(g.params for g in groups), bytes=sum(g.bytes for g in groups))
    return Inventory(groups=tuple(groups), shards=tuple(shards), totals=totals)


def _group(t: GgufTensorInfo, file: str, layers: int) -> TensorGroup:
    m = _BLOCK.match(t.name)
    bid = int(m.group(1)) if m else None
    base, role = _split_name(t.name)
    pattern = _DIGITS.sub("{}", t.name)
    subs = tuple(int(d) for d in _DIGITS.findall(t.name)[1:])
    component = component_of(base)
    mtp = bid is not None and bid >= layers
    shape = tuple(reversed(t.shape))
    experts = shape[0] if component == "routed_expert" and len(shape) == 3 and role == "weight" else None
    module = pattern.rsplit(".", 1)[0] if role != "other" else pattern
    return TensorGroup(
        pattern=pattern, index=bid, component=component, role=role, module=module,
        layer=bid if bid is not None and not mtp else None, mtp_layer=bid - layers if mtp else None,
        dtypes=(t.ggml_type,), shape=shape, tensors=1, bytes=t.nbytes, elements=t.elements,
        params=t.elements if role in ("weight", "bias", "other") else 0, scheme=t.ggml_type,
        shards=frozenset({file}), subs=(subs,) if subs else (),
        kind="grouped" if experts is not None else "", experts=experts,
    )


def is_nextn(group: TensorGroup) -> bool:
    """A ``blk.N.nextn.*`` tensor (the MTP-specific part of a NextN block)."""
    return ".nextn." in group.pattern
