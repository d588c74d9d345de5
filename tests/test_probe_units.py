"""Probe units: dequantizers vs reference quantizers, family MTP forwards vs independent code,
walk / metrics / cost arithmetic. CPU, random weights, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from probe_helpers import torch

from ckptinspect.probe import dequant
from ckptinspect.probe.chain import stream_mask
from ckptinspect.probe.metrics import Tally, wilson
from ckptinspect.probe.walk import leading_accepts, match_matrix, verify_walk
from ckptinspect.render.probe_out import tally_json

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ---- (4) dequantizers: reference quantize -> dequantize within each format's error -----------------
def _round_e2m1(x):
    """Reference E2M1 rounding written independently: nearest representable magnitude, sign kept."""
    mags = x.abs()
    idx = (mags[..., None] - E2M1).abs().argmin(-1)
    return idx | ((x < 0).long() << 3), E2M1[idx] * torch.sign(x)


def _pack(codes):
    flat = codes.reshape(*codes.shape[:-1], -1, 2)
    return (flat[..., 0] | (flat[..., 1] << 4)).to(torch.uint8)  # low nibble = even element


def test_nvfp4_roundtrip_and_nibble_order():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 64, generator=g) * 0.05
    scale_2 = w.abs().max() / (6 * 448)
    blocks = w.reshape(32, 4, 16)
    bscale = (blocks.abs().amax(-1) / 6 / scale_2).to(torch.float8_e4m3fn)
    codes, rounded = _round_e2m1(blocks / (bscale.float()[..., None] * scale_2))
    packed = _pack(codes.reshape(32, 64))
    out = dequant.dequant_nvfp4(packed, bscale, scale_2)
    expected = (rounded * bscale.float()[..., None] * scale_2).reshape(32, 64)
    assert torch.allclose(out, expected, atol=1e-7)
    # error bound: half the widest E2M1 step (1.0 between 4 and 6) times the block scale, plus fp8 scale rounding
    bound = (bscale.float() * scale_2)[..., None].expand(32, 4, 16).reshape(32, 64) * 1.0 + 0.07 * w.abs()
    assert torch.all((out - w).abs() <= bound)
    # nibble order: byte 0x21 -> element 0 = code 1 (0.5), element 1 = code 2 (1.0)
    one = dequant.unpack_e2m1(torch.tensor([[0x21]], dtype=torch.uint8))
    assert one.tolist() == [[0.5, 1.0]]


def test_fp8_block_roundtrip():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(200, 300, generator=g)
    rb, cb = math.ceil(200 / 128), math.ceil(300 / 128)
    scale = torch.zeros(rb, cb)
    q = torch.zeros(200, 300, dtype=torch.float8_e4m3fn)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = blk.abs().max() / 448.0
            scale[i, j] = s
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / s).to(torch.float8_e4m3fn)
    out = dequant.dequant_fp8_block(q, scale)
    rel = ((out - w).abs() / w.abs().clamp(min=1e-3)).median()
    assert rel < 0.07  # e4m3 has a 3-bit mantissa: relative step 2^-3, half of it on average
    assert torch.allclose(out[:128, :128], q[:128, :128].float() * scale[0, 0])


def test_mxfp4_roundtrip():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 4, 32, generator=g)
    exp = torch.floor(torch.log2(w.abs().amax(-1) / 6.0)).clamp(-127, 127) + 1  # scale so max fits 6
    codes, rounded = _round_e2m1(w / torch.pow(2.0, exp)[..., None])
    blocks = _pack(codes)  # [8, 4, 16]
    scales = (exp + 127).to(torch.uint8)
    out = dequant.dequant_mxfp4(blocks, scales)
    assert out.shape == (8, 128)
    assert torch.allclose(out, (rounded * torch.pow(2.0, exp)[..., None]).reshape(8, 128))
    assert torch.all((out.reshape(8, 4, 32) - w).abs() <= torch.pow(2.0, exp)[..., None] * 1.0 + 1e-6)


# ---- (5) family forwards vs independent straightforward code ------------------------------------
def _rms(x, w, eps, offset):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (offset + w.float())).to(x.dtype)


def _causal(n):
    return torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (0.0 if p.dim() > 1 else 0.3))


def _inputs(main, n=9, seed=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, main.config.get_text_config().vocab_size, (2, n), generator=g)
    hidden = torch.randn(2, n, main.config.get_text_config().hidden_size, generator=g)
    pos = torch.arange(1, n + 1)[None].expand(2, n)
    return ids, hidden, pos


def _tiny(kind):
    import build_fixtures as bf
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind == "ernie":  # no trained fixture: a random tiny ERNIE-4.5-MoE main model is enough here
        torch.manual_seed(0)
        cfg = AutoConfig.for_model("ernie4_5_moe", vocab_size=128, hidden_size=64, intermediate_size=128,
                                   moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, moe_num_experts=4, moe_k=2, moe_layer_start_index=0,
                                   max_position_embeddings=256, use_bias=False)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()

    tok = bf.make_tokenizer()
    cfg = bf._configs(kind, tok)
    model_type = cfg.pop("model_type")
    cfg.pop("architectures")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg), dtype=torch.float32).eval()


@pytest.mark.parametrize("kind,family,offset,hidden_first", [("qwen35moe", "qwen3_5_moe", 1.0, False),
                                                              ("mimo", "mimo", 0.0, True),
                                                              ("ernie", "ernie4_5_moe", 0.0, False)])
def test_fusion_head_equals_independent_forward(kind, family, offset, hidden_first):
    import copy

    from ckptinspect.probe.heads import spec_for_family
    from ckptinspect.probe.heads.fusion import FusionHead

    main = _tiny(kind)
    if kind == "qwen35moe":  # the hybrid path: a full-attention MTP block over a linear-attention backbone
        assert "linear_attention" in main.config.layer_types
        assert any(hasattr(layer, "linear_attn") for layer in main.get_decoder().layers)
    spec = spec_for_family(family)
    head = FusionHead(main, spec, None)
    _randomize(head, 7)
    w = head.export()  # checkpoint layout, per-expert tensors
    # reload through the checkpoint path (per-expert -> fused) and check the round trip
    head2 = FusionHead(main, spec, w)
    ids, hidden, pos = _inputs(main)
    mask = _causal(ids.shape[1])
    got = head2.logits(head2.step(head2.embed(ids), hidden, pos, mask))

    cfg = copy.deepcopy(main.config.get_text_config())
    eps = cfg.rms_norm_eps
    emb = main.get_input_embeddings().weight[ids]
    e = _rms(emb, w[f"{spec.emb_norm}.weight"], eps, offset)
    h = _rms(hidden, w[f"{spec.hidden_norm}.weight"], eps, offset)
    x = torch.cat([h, e] if hidden_first else [e, h], -1) @ w[f"{spec.proj}.weight"].T
    cfg.layer_types = ["full_attention"]  # the MTP block is full attention whatever the backbone
    layer = type(main.get_decoder().layers[-1])(cfg, 0).eval()
    state = {}
    for name in layer.state_dict():
        if name.endswith("experts.gate_up_proj"):
            n = getattr(cfg, "num_experts", None) or cfg.moe_num_experts
            state[name] = torch.stack([torch.cat([w[f"{spec.block}mlp.experts.{i}.gate_proj.weight"],
                                                  w[f"{spec.block}mlp.experts.{i}.up_proj.weight"]]) for i in range(n)])
        elif name.endswith("experts.down_proj"):
            n = getattr(cfg, "num_experts", None) or cfg.moe_num_experts
            state[name] = torch.stack([w[f"{spec.block}mlp.experts.{i}.down_proj.weight"] for i in range(n)])
        else:
            state[name] = w[spec.block + name]
    layer.load_state_dict(state)
    rotary = main.get_decoder().rotary_emb
    rpos = pos[None].expand(3, -1, -1) if hasattr(rotary, "mrope_section") else pos
    y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x, rpos))
    y = y[0] if isinstance(y, tuple) else y
    if spec.final_norm:  # ERNIE has none: the block output goes straight to the LM head
        y = _rms(y, w[f"{spec.final_norm}.weight"], eps, offset)
    want = y @ main.get_output_embeddings().weight.T
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    # a swapped concatenation order gives a different answer (the test can fail)
    x_bad = torch.cat([e, h] if hidden_first else [h, e], -1) @ w[f"{spec.proj}.weight"].T
    assert not torch.allclose(x, x_bad)


def test_deepseek_head_equals_independent_forward():
    from ckptinspect.probe.heads.transformers_mtp import TransformersMtpHead

    main = _tiny("deepseek")
    head = TransformersMtpHead.fresh(main, family="deepseek_v3")
    _randomize(head.mtp.layers, 11)
    ids, hidden, pos = _inputs(main)
    mask = _causal(ids.shape[1])
    got = head.logits(head.step(head.embed(ids), hidden, pos, mask))
    layer = head.mtp.layers[0]
    eps = main.config.rms_norm_eps
    emb = main.get_input_embeddings().weight[ids]
    x = torch.cat([_rms(emb, layer.enorm.weight, eps, 0.0), _rms(hidden, layer.hnorm.weight, eps, 0.0)], -1)
    x = x @ layer.eh_proj.weight.T
    block = type(main.get_decoder().layers[-1])(main.config.get_mtp_config(), 0).eval()
    block.load_state_dict(layer.mtp_block.state_dict())
    assert block.mlp.__class__.__name__.endswith("MoE")  # the MTP block is MoE (first_k_dense_replace = 0)
    y = block(x, attention_mask=mask, position_ids=pos,
              position_embeddings=main.get_decoder().rotary_emb(x, pos))
    y = _rms(y, layer.post_norm.weight, eps, 0.0)
    want = y @ main.get_output_embeddings().weight.T
    assert torch.allclose(got, want, atol=1e-4)


# ---- chain mask, walk, metrics, cost ------------------------------------------------------------
def test_stream_mask_structure():
    m = stream_mask(3, 4, torch.float32, "cpu")[0, 0] == 0
    # stream 1 query t sees stream-1 keys <= t only
    assert m[2, :4].tolist() == [True, True, True, False] and not m[2, 4:].any()
    # stream 3 query t=1 sees stream-1 keys 0..1, stream-2 key t=1, stream-3 key t=1
    row = m[8 + 1]
    assert row[:4].tolist() == [True, True, False, False]
    assert row[4:8].tolist() == [False, True, False, False] and row[8:].tolist() == [False, True, False, False]


def test_walk_and_metrics_arithmetic():
    tokens = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    drafts = np.zeros((2, 9), dtype=int)
    drafts[0] = np.arange(2, 11)  # depth 1 always right
    drafts[1] = np.arange(3, 12)
    drafts[1, 4] = 99  # depth 2 wrong at start 4
    m = match_matrix(drafts, tokens, 10)
    assert leading_accepts(m)[:5].tolist() == [2, 2, 2, 2, 1]
    assert not m[1, 7]  # start 7 at depth 2 would predict index 10: past the end
    assert verify_walk(m, prompt_len=2, length=10) == [2, 1]  # t=1 -> 4 -> 6 (stop: 6 + 2 drafts + bonus > 9)
    t = Tally(2)
    t.add_walk([2, 1, 2])
    j = tally_json(t)
    assert j["accept_length_sglang"] == pytest.approx(8 / 3) and j["histogram"] == [0, 1, 2]
    assert j["accept_length_vllm"] == pytest.approx(1 + 5 / 3) and j["accept_rate"] == pytest.approx(5 / 6)
    lo, hi = wilson(8, 10)
    assert 0.44 < lo < 0.5 and 0.94 < hi < 0.98  # Wilson 95% for 8/10 = [0.490, 0.943]


def test_cost_model_limits():
    from ckptinspect.probe import cost

    gpu = cost.resolve_gpu("H200", "bf16")
    m = cost.ModelCost(dense_bytes=10 ** 10, dense_params=5 * 10 ** 9, expert_bytes=0, expert_params=0, num_experts=0,
                       top_k=0, head_bytes=10 ** 9, head_params=5 * 10 ** 8, mtp_dense_bytes=4 * 10 ** 8,
                       mtp_dense_params=2 * 10 ** 8, mtp_expert_bytes=0, mtp_expert_params=0)
    rows = cost.speedup_table(m, gpu, {1: 1.8, 3: 2.9}, batches=(1, 4096))
    r = (4 * 10 ** 8 + 10 ** 9) / (10 ** 10 + 10 ** 9)
    assert rows[0]["by_steps"]["1"] == pytest.approx(1.8 / (1 + r), rel=1e-6)  # memory bound: tau / (1 + K r)
    assert rows[1]["by_steps"]["3"] < 1.0  # compute bound at huge batch: MTP stops paying
    assert rows[1]["best_steps"] == 0


# ---- loader: which tensors are dequantized how (the scheme comes from quant/detect.py) -------------
def _metas(entries):
    from ckptinspect.probe.loader import TensorMeta

    return {n: TensorMeta(n, d, tuple(s), "m.safetensors", 0) for n, d, s in entries}


@pytest.mark.parametrize("entries,name,kind", [
    # ModelOpt NVFP4: packed U8 + F8 block scale + F32 global scale
    ([("l.weight", "U8", [64, 16]), ("l.weight_scale", "F8_E4M3", [64, 2]), ("l.weight_scale_2", "F32", []),
      ("l.input_scale", "F32", [])], "l.weight", "nvfp4"),
    # DeepSeek FP8 block (scale_inv) and the same blocks under the compressed-tensors name
    ([("l.weight", "F8_E4M3", [256, 256]), ("l.weight_scale_inv", "F32", [2, 2])], "l.weight", "fp8_block"),
    ([("l.weight", "F8_E4M3", [256, 256]), ("l.weight_scale", "F32", [2, 2])], "l.weight", "fp8_block"),
    # FP8 per channel / per tensor, and FP8 with no scale at all (a plain cast)
    ([("l.weight", "F8_E4M3", [64, 32]), ("l.weight_scale", "F32", [64, 1])], "l.weight", "fp8_scaled"),
    ([("l.weight", "F8_E4M3", [64, 32]), ("l.weight_scale", "F32", [])], "l.weight", "fp8_scaled"),
    ([("l.weight", "F8_E4M3", [64, 32])], "l.weight", None),
    # gpt-oss MXFP4
    ([("e.down_blocks", "U8", [4, 64, 2, 16]), ("e.down_scales", "U8", [4, 64, 2])], "e.down_blocks", "mxfp4"),
    ([("l.weight", "BF16", [8, 8])], "l.weight", None),
    # packed formats the probe cannot dequantize are refused by name, not loaded as raw bytes
    ([("l.weight_packed", "U8", [64, 16]), ("l.weight_scale", "F8_E4M3", [64, 2]),
      ("l.weight_global_scale", "F32", [])], "l.weight_packed", "unsupported:nvfp4"),
    ([("l.qweight", "I32", [64, 8]), ("l.scales", "F16", [1, 64]), ("l.qzeros", "I32", [1, 8])], "l.qweight",
     "unsupported:int4_awq"),
])
def test_loader_storage_kind(entries, name, kind):
    from ckptinspect.probe.loader import needs_dequant, quant_kind

    metas = _metas(entries)
    assert quant_kind(name, metas) == kind
    # a BF16 copy only for what the probe can dequantize; packed formats go to transformers' own loader
    assert needs_dequant(metas) is (kind in ("nvfp4", "fp8_block", "fp8_scaled", "mxfp4"))
    companions = [n for n in metas if n != name and not n.endswith((".scales", ".qzeros"))]
    assert all(quant_kind(n, metas) == "companion" for n in companions)


def test_loader_dequantizes_compressed_tensors_fp8_blocks(tmp_path):
    from safetensors.torch import save_file

    from safetensors import safe_open

    from ckptinspect.probe.loader import TensorMeta, iter_tensors, logical_params

    g = torch.Generator().manual_seed(3)
    w = (torch.randn(256, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 1, generator=g) + 0.5
    save_file({"l.weight": w, "l.weight_scale": scale, "n.weight": torch.ones(3, dtype=torch.bfloat16)},
              str(tmp_path / "m.safetensors"))
    metas = {}
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as fh:  # the safetensors library's own header reader
        for name in fh.keys():
            sl = fh.get_slice(name)
            metas[name] = TensorMeta(name, sl.get_dtype(), tuple(sl.get_shape()), "m.safetensors", 0)
    out = dict(iter_tensors(str(tmp_path), metas, lambda n: True, torch.float32))
    assert sorted(out) == ["l.weight", "n.weight"]  # the scale is folded in, not loaded as a parameter
    assert torch.equal(out["l.weight"], dequant.dequant_fp8_block(w, scale))
    assert logical_params(metas) == 256 * 128 + 3


def test_cost_calibration_file_and_overhead(tmp_path):
    """The measured calibration (benchmarks/results) is read, and the overhead enters every forward."""
    import json
    import os

    from ckptinspect.errors import ProbeError
    from ckptinspect.probe import cost

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    eff = cost.load_efficiency(os.path.join(root, "benchmarks", "results", "cost_calibration_h200.json"))
    assert 0 < eff.bandwidth <= 1 and 0 < eff.flops <= 1 and eff.overhead_s > 0 and "calibrated" in eff.source
    gpu = cost.resolve_gpu("H200", "bf16")
    m = cost.ModelCost(dense_bytes=10 ** 10, dense_params=5 * 10 ** 9, expert_bytes=0, expert_params=0, num_experts=0,
                       top_k=0, head_bytes=10 ** 9, head_params=5 * 10 ** 8, mtp_dense_bytes=4 * 10 ** 8,
                       mtp_dense_params=2 * 10 ** 8, mtp_expert_bytes=0, mtp_expert_params=0)
    custom = cost.Efficiency(0.5, 0.5, 0.01, "test")
    row = cost.speedup_table(m, gpu, {2: 2.5}, batches=(1,), eff=custom)[0]
    t_target = (10 ** 10 + 10 ** 9) / (gpu.bandwidth_bytes_s * 0.5) + 0.01  # memory bound at batch 1
    t_draft = (4 * 10 ** 8 + 10 ** 9) / (gpu.bandwidth_bytes_s * 0.5) + 0.01
    assert row["by_steps"]["2"] == pytest.approx(2.5 * t_target / (t_target + 2 * t_draft), rel=1e-6)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"bandwidth_efficiency": 2.0, "flop_efficiency": 0.5}))
    with pytest.raises(ProbeError, match="out of range"):
        cost.load_efficiency(str(bad))
    bad.write_text("{}")
    with pytest.raises(ProbeError, match="not a cost calibration"):
        cost.load_efficiency(str(bad))


@pytest.mark.parametrize("kind", ["deepseek", "qwen35moe_nvfp4"])
def test_cost_weights_agree_with_plan_memory_model(kind):
    """The probe's roofline bytes (from the inventory) and the plan's per-GPU memory model at TP 1
    differ by exactly the engine's vocab padding of the embedding and LM head (SGLang pads the vocab
    to a multiple of 64), nothing else."""
    from probe_helpers import fixture

    from ckptinspect.plan.memory import weights_per_gpu
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.result import model_cost

    pc = open_checkpoint(fixture(kind))
    cfg = pc.checkpoint.config
    m = model_cost(pc.inventory, cfg)
    emb = sum(g.bytes for g in pc.inventory.groups if g.mtp_layer is None and g.component == "embedding")
    ours = m.dense_bytes + m.expert_bytes + m.head_bytes + m.mtp_dense_bytes + m.mtp_expert_bytes + emb
    padded = -(-cfg.vocab_size // 64) * 64
    padding = 2 * (padded - cfg.vocab_size) * cfg.hidden_size * 2  # embedding + LM head, BF16
    assert weights_per_gpu(pc.checkpoint, 1, 1, with_mtp=True) - ours == padding
