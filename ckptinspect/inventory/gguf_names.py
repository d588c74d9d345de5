"""GGUF tensor names -> the Hugging Face module names they were converted from, so `diff` can compare a
safetensors original with its GGUF module by module.

The table inverts llama.cpp's converter naming (gguf-py/gguf/tensor_mapping.py ``TensorNameMap``: the
``model.layers.{bid}.*`` spellings of the Llama / Qwen / DeepSeek / GLM families, which
convert_hf_to_gguf.py ``ModelBase.map_tensor_name`` applies). Experts are merged into one 3-D tensor per
layer by the converter (``ffn_*_exps``), so they map to the ``mlp.experts`` container the diff compares
routed experts as. tests/test_gguf_diff.py converts a safetensors fixture with the gguf package's own
``TensorNameMap`` and checks every module maps back. Names not in the table keep their GGUF spelling
(and show up as added / removed, never silently matched).
"""

from __future__ import annotations

import dataclasses
import re

from ckptinspect.records import Checkpoint, Inventory, TensorGroup

GLOBAL: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

BLOCK: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",  # GLM-4.5 (glm4moe)
    "ffn_norm": "post_attention_layernorm",  # Llama / Qwen / DeepSeek
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "exp_probs_b": "mlp.gate",  # e_score_correction_bias, a parameter of the router module
    "ffn_gate_exps": "mlp.experts",
    "ffn_up_exps": "mlp.experts",
    "ffn_down_exps": "mlp.experts",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "nextn.eh_proj": "eh_proj",
    "nextn.enorm": "enorm",
    "nextn.hnorm": "hnorm",
    "nextn.embed_tokens": "embed_tokens",
    "nextn.shared_head_head": "shared_head.head",
    "nextn.shared_head_norm": "shared_head.norm",
}

_NAME = re.compile(r"^blk\.\{\}\.(.+)\.(weight|bias)$")


def hf_module(group: TensorGroup) -> str | None:
    """The Hugging Face module pattern of a GGUF group (``model.layers.{}.self_attn.q_proj``), None if unknown."""
    if group.pattern.startswith("blk."):
        m = _NAME.match(group.pattern)
        if m and m.group(1) in BLOCK:
            return f"model.layers.{{}}.{BLOCK[m.group(1)]}"
        return None
    base = group.pattern.rsplit(".", 1)[0]
    return GLOBAL.get(base)


def hf_view(checkpoint: Checkpoint) -> Checkpoint:
    """The GGUF checkpoint with every known module renamed to its Hugging Face spelling (for diff only)."""
    groups = []
    for g in checkpoint.inventory.groups:
        module = hf_module(g)
        if module is not None:
            g = dataclasses.replace(g, module=module, pattern=f"{module}.{g.role}")
        groups.append(g)
    inventory = Inventory(groups=tuple(groups), shards=checkpoint.inventory.shards, totals=checkpoint.inventory.totals)
    return dataclasses.replace(checkpoint, inventory=inventory)
