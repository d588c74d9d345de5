"""Name-pattern classification and MTP prefix templates (inventory stage)."""

from __future__ import annotations

import pytest

from ckptinspect.errors import RuleError
from ckptinspect.inventory.classify import component_of, expert_slot, split_role
from ckptinspect.inventory.mtp_prefix import assign_mtp, compile_prefixes


@pytest.mark.parametrize("module,component", [
    ("model.embed_tokens", "embedding"),
    ("lm_head", "lm_head"),
    ("model.layers.{}.shared_head.head", "lm_head"),
    ("model.layers.{}.input_layernorm", "norm"),
    ("mtp.pre_fc_norm_embedding", "norm"),
    ("model.mtp.layers.{}.enorm.m", "norm"),
    ("model.layers.{}.eh_proj", "mtp_fusion"),
    ("mtp.fc", "mtp_fusion"),
    ("model.layers.{}.mlp.gate", "router"),
    ("model.layers.{}.mlp.gate.e_score_correction_bias", "router"),
    ("model.layers.{}.mlp.shared_experts.down_proj", "shared_expert"),
    ("model.language_model.layers.{}.mlp.shared_expert_gate", "shared_expert"),
    ("model.layers.{}.mlp.experts.{}.up_proj", "routed_expert"),
    ("model.layers.{}.mlp.experts.gate_up_proj", "routed_expert"),
    ("model.layers.{}.self_attn.kv_b_proj", "attention"),
    ("model.language_model.layers.{}.linear_attn.in_proj_qkvz", "attention"),
    ("model.layers.{}.mlp.down_proj", "mlp"),
    ("model.visual.blocks.{}.attn.qkv", "vision"),
])
def test_components(module, component):
    assert component_of(module) == component


@pytest.mark.parametrize("pattern,module,role", [
    ("a.weight_scale_2", "a", "scale_2"),
    ("a.weight_scale_inv", "a", "scale"),
    ("a.weight_packed", "a", "weight"),
    ("a.weight_global_scale", "a", "global_scale"),
    ("a.qweight", "a", "weight"),
    ("a.g_idx", "a", "g_idx"),
    ("m.experts.gate_up_proj_blocks", "m.experts.gate_up_proj", "weight"),
    ("m.experts.gate_up_proj_scales", "m.experts.gate_up_proj", "scale"),
    ("m.experts.gate_up_proj", "m.experts.gate_up_proj", "weight"),  # fused 3-D, bare parameter
    ("a.self_attn.k_proj.k_scale", "a.self_attn.k_proj", "kv_scale"),
    ("a.weight.quant_state.bitsandbytes__nf4", "a", "other_companion"),
])
def test_roles(pattern, module, role):
    got_module, _, got_role = split_role(pattern)
    assert (got_module, got_role) == (module, role)


def test_expert_slot():
    assert expert_slot("model.layers.{}.mlp.experts.{}.up_proj") == 1
    assert expert_slot("model.layers.{}.mlp.experts.up_proj") is None


def test_mtp_templates_place_layers():
    prefixes = compile_prefixes(("model.layers.{L+k}.", "mtp.layers.{k}.", "mtp.", "model.mtp_layers.{k}."), 61)
    assert assign_mtp("model.layers.{}.mlp.gate.weight", 61, prefixes, 61) == 0
    assert assign_mtp("model.layers.{}.mlp.gate.weight", 62, prefixes, 61) == 1
    assert assign_mtp("model.layers.{}.mlp.gate.weight", 60, prefixes, 61) is None
    assert assign_mtp("mtp.fc.weight", None, prefixes, 61) == 0
    assert assign_mtp("mtp.layers.{}.input_layernorm.weight", 2, prefixes, 61) == 2
    assert assign_mtp("model.mtp_layers.{}.input_proj.weight", 0, prefixes, 61) == 0
    assert assign_mtp("model.norm.weight", None, prefixes, 61) is None
    fixed = compile_prefixes(("model.layers.{L}.",), 92)
    assert assign_mtp("model.layers.{}.eh_proj.weight", 92, fixed, 92) == 0
    assert assign_mtp("model.layers.{}.eh_proj.weight", 93, fixed, 92) is None


def test_mtp_template_must_put_the_index_first():
    with pytest.raises(RuleError, match="only the first index"):
        compile_prefixes(("model.{*}.layers.{k}.",), 4)
