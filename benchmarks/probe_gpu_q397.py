"""Truncated nvidia/Qwen3.5-397B-A17B-NVFP4 layout for benchmarks/probe_gpu.py (section q397).

Real widths from fixtures/data/nvidia__Qwen3.5-397B-A17B-NVFP4__config.json (hidden 4096, 512 routed
experts of 1024, 10 per token, vocab 248,320, 3 linear-attention layers per full-attention layer),
but 4 decoder layers instead of 60, text-only (Qwen3_5MoeForCausalLM names). Routed experts are
ModelOpt NVFP4 (packed E2M1 + F8_E4M3 block scales + F32 global scale), everything else BF16, the
MTP layer BF16 with its 512 experts, as in the real checkpoint (its hf_quant_config excludes
``mtp.layers.0*``). Random values: this measures time, bytes and memory, not acceptance.
"""

from __future__ import annotations

import json
import os
import time

import torch

LAYERS = 4
FULL_LAYERS_397B, LINEAR_LAYERS_397B = 15, 45


def _config(layers: int = LAYERS) -> dict:
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "data",
                       "nvidia__Qwen3.5-397B-A17B-NVFP4__config.json")
    text = dict(json.load(open(src))["text_config"])
    text.update(num_hidden_layers=layers, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
                model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"], eos_token_id=2,
                pad_token_id=0, bos_token_id=1)
    return text


def _nvfp4(out_f: int, in_f: int, g: torch.Generator):
    packed = torch.randint(0, 256, (out_f, in_f // 2), dtype=torch.uint8, device="cuda", generator=g)
    scale = (torch.rand(out_f, in_f // 16, device="cuda", generator=g) + 0.5).to(torch.float8_e4m3fn)
    return packed, scale, torch.tensor(0.004, dtype=torch.float32)


def build(path: str, layers: int = LAYERS) -> dict:
    """``layers`` (a multiple of 4: 3 linear-attention layers, then a full-attention one, as in the
    real model's layer_types) full-width decoder layers + the resident parts + the MTP layer."""
    import build_fixtures as bf
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.perf_counter()
    os.makedirs(path, exist_ok=True)
    if layers % 4:
        raise ValueError("layers must be a multiple of 4 (the 397B layout repeats 3 linear + 1 full attention)")
    cfg_dict = _config(layers)
    cfg = AutoConfig.for_model("qwen3_5_moe_text", **{k: v for k, v in cfg_dict.items()
                                                      if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    weight_map: dict[str, str] = {}
    experts, hidden, inter = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size

    def dense(shape):
        return (torch.randn(shape, device="cuda", generator=g) * 0.02).to(torch.bfloat16)

    def write(shard, tensors):
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, os.path.join(path, shard),
                  metadata={"format": "pt"})
        weight_map.update({k: shard for k in tensors})

    state = model.state_dict()
    for layer in range(layers):
        pre = f"model.layers.{layer}."
        tensors = {}
        for key, t in state.items():
            if not key.startswith(pre):
                continue
            if key.endswith("experts.gate_up_proj") or key.endswith("experts.down_proj"):
                continue
            tensors[key] = dense(tuple(t.shape)) if t.dim() > 1 else torch.zeros(t.shape, dtype=torch.bfloat16,
                                                                                   device="cuda")
        for e in range(experts):
            for proj, (o, i) in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                 ("down_proj", (hidden, inter))):
                base = f"{pre}mlp.experts.{e}.{proj}"
                packed, scale, scale_2 = _nvfp4(o, i, g)
                tensors[base + ".weight"] = packed
                tensors[base + ".weight_scale"] = scale
                tensors[base + ".weight_scale_2"] = scale_2
                tensors[base + ".input_scale"] = torch.tensor(1.0)
        write(f"model-layer{layer}.safetensors", tensors)
    write("model-resident.safetensors", {"model.embed_tokens.weight": dense((cfg.vocab_size, hidden)),
                                         "lm_head.weight": dense((cfg.vocab_size, hidden)),
                                         "model.norm.weight": torch.zeros(hidden, dtype=torch.bfloat16)})
    # MTP: the layer-0 block of a full-attention layer (same key layout), experts per expert, BF16
    mtp = {"mtp.fc.weight": dense((hidden, 2 * hidden))}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{n}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)
    full = f"model.layers.{layers - 1}."
    for key, t in state.items():
        if key.startswith(full) and not key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            mtp["mtp.layers.0." + key[len(full):]] = dense(tuple(t.shape)) if t.dim() > 1 else torch.zeros(
                t.shape, dtype=torch.bfloat16)
    write("mtp-a.safetensors", mtp)
    mtp_exp = {}
    for e in range(experts):
        for proj, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
            mtp_exp[f"mtp.layers.0.mlp.experts.{e}.{proj}.weight"] = dense(shape)
    write("mtp-experts.safetensors", mtp_exp)
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(path, "model.safetensors.index.json"), "w"))
    cfg_dict["mtp_num_hidden_layers"] = 1
    json.dump(cfg_dict, open(os.path.join(path, "config.json"), "w"), indent=1)
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
             "exclude_modules": ["lm_head", "*.mlp.shared_expert*", "*linear_attn*", "*self_attn*", "mtp.layers.0*",
                                 "*mlp.gate", "*shared_expert_gate"]}
    json.dump({"producer": {"name": "modelopt", "version": "bench"}, "quantization": quant},
              open(os.path.join(path, "hf_quant_config.json"), "w"))
    tok = bf.make_tokenizer()
    tok.save_pretrained(path)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"build_s": time.perf_counter() - t0, "bytes_on_disk": size}


def run_q397(work: str, corpus: str, drop_cache, probe_run) -> dict:
    path = os.path.join(work, "q397-trunc")
    out = {"build": build(path)}
    drop_cache(path)
    run = probe_run(path, mode="teacher", corpus=corpus, steps=3, batch_size=4, max_gpu_memory=60.0)
    out["run"] = run
    per = run["streaming"]["per_layer"]  # layers 0-2 linear attention, 3 full attention
    linear = sum(r["read_s"] + r["compute_s"] for r in per[:3]) / 3
    full = per[3]["read_s"] + per[3]["compute_s"]
    timings = run["timings_s"]
    fixed_s = timings.get("load", 0.0)  # tokenizer, resident embedding / norm / LM head, MTP layer
    mtp_s = timings.get("mtp_chain", 0.0) + timings.get("walk", 0.0)
    out["extrapolated_397b_s"] = fixed_s + LINEAR_LAYERS_397B * linear + FULL_LAYERS_397B * full + mtp_s
    out["extrapolation"] = {"fixed_load_s": fixed_s, "linear_layer_s": linear, "full_layer_s": full,
                            "mtp_chain_and_walk_s": mtp_s, "layers": [LINEAR_LAYERS_397B, FULL_LAYERS_397B],
                            "note": "60 layers = 45 linear + 15 full attention at the measured per-layer times"}
    return out
