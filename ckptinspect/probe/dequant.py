"""Dequantizers for pre-quantized checkpoint formats transformers cannot load itself.

Layouts (docs/reference/checkpoint_formats.md, mtp_families.md §6):
- NVFP4 (ModelOpt): ``weight`` U8 [out, in/2], two E2M1 codes per byte, **low nibble = even element**;
  ``weight_scale`` F8_E4M3 [out, in/16] (one scale per 16 values); ``weight_scale_2`` F32 scalar
  (global). value = e2m1 * scale * scale_2.
- FP8 block (DeepSeek-V3 style): ``weight`` F8_E4M3 [out, in]; ``weight_scale_inv`` F32
  [ceil(out/128), ceil(in/128)]; value = weight * scale_inv of its 128x128 block.
- MXFP4 (OCP MX, gpt-oss layout): ``*_blocks`` U8 [..., G, 16] (32 E2M1 codes per group, low nibble
  first), ``*_scales`` U8 E8M0 [..., G]; value = e2m1 * 2**(scale - 127).
"""

from __future__ import annotations

import torch

# E2M1: sign bit 3, exponent bits 2..1, mantissa bit 0 -> these 8 magnitudes (OCP MX spec v1.0 §5.3.3).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_table(device) -> torch.Tensor:
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])  # codes 0..7 positive, 8..15 negative


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """U8 [..., n] -> float32 [..., 2n]; the low nibble is the even element."""
    table = _e2m1_table(packed.device)
    p = packed.to(torch.int32)
    low = table[p & 0x0F]
    high = table[(p >> 4) & 0x0F]
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequant_nvfp4(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                  *, block: int = 16) -> torch.Tensor:
    values = unpack_e2m1(weight)  # [out, in]
    scale = weight_scale.to(torch.float32).repeat_interleave(block, dim=-1)[..., : values.shape[-1]]
    return values * scale * weight_scale_2.to(torch.float32).reshape(())


def dequant_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, *, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    w = weight.to(torch.float32)
    rows, cols = w.shape[-2:]
    s = scale_inv.to(torch.float32)
    s = s.repeat_interleave(block[0], dim=-2)[..., :rows, :].repeat_interleave(block[1], dim=-1)[..., :cols]
    return w * s


def dequant_fp8_scaled(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 per-tensor (scalar scale) or per-channel ([out] or [out, 1]) scale."""
    s = scale.to(torch.float32)
    if s.dim() == 1 and s.numel() > 1:
        s = s[:, None]
    return weight.to(torch.float32) * s


def dequant_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    values = unpack_e2m1(blocks)  # [..., G, 32]
    exp = scales.to(torch.int32) - 127
    out = values * torch.pow(2.0, exp.to(torch.float32))[..., None]
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * values.shape[-1])
