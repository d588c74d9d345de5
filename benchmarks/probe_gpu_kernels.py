"""Device checks of issue 33's CPU-verified changes, for the GPU run (one CUDA GPU, a minute or two):

1. the MTP chain's kept-stream attention (stream_attention.streams_attention) through the CUDA fused
   kernels (flash for half precision, memory-efficient otherwise; MLA's 192 / 128 head sizes, GQA)
   against the dense stream-mask softmax, with its time beside the old dense-mask SDPA over all streams;
2. a Qwen3.5-397B-sized Gated DeltaNet layer's peak bytes per token against
   scoring.linear_attention_bytes_per_token (which recurrence ran: flash-linear-attention or torch);
3. greedy generate eager vs static KV cache (compiled decode) on a small random Qwen2: same tokens, times.

    python3 benchmarks/probe_gpu_kernels.py
"""

from __future__ import annotations

import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import transformers  # noqa: E402

from ckptinspect.probe.chain import stream_mask  # noqa: E402
from ckptinspect.probe.scoring import fused_linear_attention, linear_attention_bytes_per_token  # noqa: E402
from ckptinspect.probe.stream_attention import streams_attention, streams_layout  # noqa: E402

DEV = "cuda"


def attention(dtype, batch, heads, kv_heads, seq, depth, dq, dv):
    g = torch.Generator(device=DEV).manual_seed(0)
    q = torch.randn(batch, heads, depth * seq, dq, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(batch, kv_heads, depth * seq, dq, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(batch, kv_heads, depth * seq, dv, device=DEV, dtype=dtype, generator=g)
    scale = dq ** -0.5
    kernels: set[str] = set()
    for _ in range(2):  # the second call is the timed one
        with streams_layout(torch.nn.Module(), depth, seq, seq, kernels):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out, _ = streams_attention(None, q, k, v, None, scaling=scale)
            torch.cuda.synchronize()
            new_s = time.perf_counter() - t
    kr, vr = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    mask = stream_mask(depth, seq, torch.float32, DEV)[0, 0, -seq:]
    ref = torch.softmax(q[:, :, -seq:].float() @ kr.float().transpose(-1, -2) * scale + mask, -1) @ vr.float()
    err = (out.transpose(1, 2)[:, :, -seq:].float() - ref).abs().max().item()
    del ref
    try:
        full_mask = stream_mask(depth, seq, dtype, DEV)
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=full_mask, scale=scale)
        torch.cuda.synchronize()
        old = f"{time.perf_counter() - t:.4f}s"
    except torch.OutOfMemoryError:
        old = "out of memory"
    print(f"attention {str(dtype)[6:]} B{batch} h{heads}/{kv_heads} S{seq} K{depth} d{dq}/{dv}: kernels "
          f"{sorted(kernels)} max|err| {err:.2e}  kept-stream {new_s:.4f}s  old dense-mask {old}")


def linear_attention():
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

    dims = dict(linear_num_value_heads=64, linear_num_key_heads=16, linear_key_head_dim=128,
                linear_value_head_dim=128)
    cfg = m.Qwen3_5MoeTextConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=2, head_dim=256,
                                 num_hidden_layers=4, layer_types=["linear_attention"] * 4, **dims)
    layer = m.Qwen3_5MoeGatedDeltaNet(cfg, 0).to(DEV, torch.bfloat16).eval()

    class Normalized:
        text = dims

    for n in (4096, 16384):
        x = torch.randn(1, n, 4096, device=DEV, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            y = layer(x)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / n
        print(f"linear attention n={n}: peak {peak:.0f} B/token; estimate {linear_attention_bytes_per_token(Normalized)} "
              f"B/token (flash-linear-attention importable: {fused_linear_attention()})")
        del x, y


def generate():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048)
    model = Qwen2ForCausalLM(cfg).to(DEV, torch.bfloat16).eval()
    ids = torch.randint(5, 4096, (16, 40), device=DEV)
    mask = torch.ones_like(ids)
    mask[:3, :7] = 0  # left padding on a few rows, as the probe batches prompts
    outs = {}
    for mode in ("eager", "static", "static"):  # static twice: the first includes compilation
        kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=64, pad_token_id=0)
        if mode == "static":
            kw["cache_implementation"] = "static"
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**kw)
        torch.cuda.synchronize()
        print(f"generate {mode}: {time.perf_counter() - t:.2f}s compiled={hasattr(model, '_compiled_call')}")
        outs.setdefault(mode, out)
    print("generate: same tokens:", torch.equal(outs["eager"], outs["static"]))


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name(0), "transformers", transformers.__version__)
    for args in [(torch.bfloat16, 2, 8, 2, 300, 3, 256, 256), (torch.bfloat16, 2, 8, 8, 300, 3, 192, 128),
                 (torch.float32, 2, 8, 2, 300, 3, 64, 64), (torch.float32, 2, 8, 8, 300, 3, 192, 128),
                 (torch.bfloat16, 2, 8, 2, 300, 1, 128, 128), (torch.bfloat16, 8, 32, 2, 2048, 3, 256, 256),
                 (torch.bfloat16, 8, 128, 128, 1024, 3, 192, 128)]:
        try:
            attention(*args)
        except Exception:  # noqa: BLE001 - a report script: print and go on to the next check
            traceback.print_exc()
    for check in (linear_attention, generate):
        try:
            check()
        except Exception:  # noqa: BLE001
            traceback.print_exc()


if __name__ == "__main__":
    main()
