"""Quantization scheme of a module, decided from its tensors (dtype, companions, shapes).

Signatures (checkpoint_formats §5; sources named there):
- ModelOpt NVFP4: ``weight`` U8 [out, in/2] + ``weight_scale`` F8_E4M3 [out, in/16] + ``weight_scale_2`` F32
  (TensorRT-LLM tells NVFP4 from FP8 by ``weight_scale_2``, NVIDIA/TensorRT-LLM PR #13716).
- compressed-tensors NVFP4: ``weight_packed`` U8 + ``weight_global_scale``; MXFP4: ``weight_packed`` U8 +
  U8 (E8M0) ``weight_scale`` and no global scale; int4 pack: ``weight_packed`` I32.
- DeepSeek FP8 block: F8 ``weight`` + ``weight_scale_inv``; F8 + ``weight_scale`` is per tensor ([] / [1]),
  per channel ([out] / [out, 1]) or block (2-D tiles).
- gpt-oss MXFP4: ``*_blocks`` U8 + ``*_scales`` U8 (E8M0).
- DeepSeek-V4 (bare ``.scale`` companions, F8_E8M0): FP8 ``weight`` F8_E4M3 [out, in] + ``.scale``
  [ceil(out/128), ceil(in/128)] is block FP8; packed FP4 experts store ``weight`` I8 [out, in/2] (two E2M1
  nibbles per byte) + ``.scale`` [out, in/32] (VL:model_executor/models/deepseek_v4.py DeepseekV4FP8Config,
  expert_dtype "fp4"; fxp19950422/rtp-llm:rtp_llm/model_loader/test/dsv4_checkpoint_inventory.py).
  An I8 weight is packed FP4 only when its scale is E8M0 and covers 32 logical values per scale
  (``scale.shape[-1] * 16 == weight.shape[-1]``); otherwise I8 + scale stays int8.
- GPTQ: ``qweight`` I32 + ``g_idx`` (or qweight packing the input dim); AWQ: ``qweight`` I32 packing the
  output dim (``qweight.shape[1] * 8 == scales.shape[1]``), no ``g_idx``.
- int8: I8 ``weight`` + a scale (``weight_scale`` or bitsandbytes ``SCB``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

FP8 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
_FLOAT = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp32"}
# Schemes that store plain floating-point weights (what the engines build as unquantized parameters).
UNQUANTIZED = frozenset(_FLOAT.values())

# Logical values per stored element of a packed weight, by scheme.
PACK_FACTOR = {"nvfp4": 2, "mxfp4": 2, "int4_awq": 8, "int4_gptq": 8, "int4_pack": 8}


@dataclass(frozen=True)
class Part:
    """One parameter of a module: its role, parameter suffix, dtype, shape and tensor count."""

    role: str
    suffix: str
    dtype: str
    shape: tuple[int, ...]
    tensors: int


def weight_part(parts: Mapping[str, Part]) -> Part | None:
    """The parameter whose dtype decides the module's scheme (its companions refine it)."""
    return (parts.get(".weight") or parts.get(".weight_packed") or parts.get(".qweight") or parts.get("_blocks")
            or parts.get(""))


def detect_scheme(parts: Mapping[str, Part]) -> str:
    """Scheme of a module from its parameters keyed by suffix (".weight", ".weight_scale", ...)."""
    weight = weight_part(parts)
    if weight is None:
        # A module with no weight (e.g. a bare bias or a kv scale) takes the dtype of what it has.
        any_part = next(iter(parts.values()))
        return _FLOAT.get(any_part.dtype, "other")
    dtype = weight.dtype
    scale = parts.get(".weight_scale") or parts.get(".scale")
    if weight.suffix == "_blocks":
        return "mxfp4" if "_scales" in parts else "other"
    if weight.suffix == ".weight_packed":
        if dtype == "I32":
            return "int4_pack"
        if ".weight_global_scale" in parts:
            return "nvfp4"
        if scale is not None and scale.dtype in ("U8", "F8_E8M0"):
            return "mxfp4"
        return "other"
    if weight.suffix == ".qweight":
        return _int4_kind(parts, weight)
    if dtype in _FLOAT and scale is None and ".weight_scale_inv" not in parts:
        return _FLOAT[dtype]
    if dtype in ("U8", "F4"):
        if ".weight_scale_2" in parts or (scale is not None and scale.dtype in FP8):
            return "nvfp4"
        if scale is not None and scale.dtype in ("U8", "F8_E8M0"):
            return "mxfp4"
        return "other"
    if dtype == "I8" and scale is not None and _packs_fp4_per_32(weight.shape, scale):
        return "mxfp4"
    if dtype in FP8:
        if ".weight_scale_inv" in parts:
            return "fp8_block"
        if scale is None:
            return "fp8_tensor"
        return _fp8_granularity(weight.shape, scale.shape)
    if dtype == "I8" and (scale is not None or ".SCB" in parts):
        return "int8"
    if dtype in _FLOAT:
        return _FLOAT[dtype]
    return "other"


def _packs_fp4_per_32(weight: tuple[int, ...], scale: Part) -> bool:
    """An E8M0 scale with one exponent per 32 logical values of a weight holding two values per byte."""
    return (scale.dtype == "F8_E8M0" and len(weight) == len(scale.shape) >= 2
            and weight[:-1] == scale.shape[:-1] and scale.shape[-1] * 16 == weight[-1])


def _fp8_granularity(weight: tuple[int, ...], scale: tuple[int, ...]) -> str:
    numel = 1
    for d in scale:
        numel *= d
    if numel == 1:
        return "fp8_tensor"
    if len(weight) >= 1 and (scale == weight[:1] or scale == (weight[0], 1)):
        return "fp8_channel"
    return "fp8_block"


def _int4_kind(parts: Mapping[str, Part], qweight: Part) -> str:
    if ".g_idx" in parts:
        return "int4_gptq"
    scales = parts.get(".scales")
    if scales is not None and len(qweight.shape) == 2 and len(scales.shape) == 2:
        if qweight.shape[1] * 8 == scales.shape[1]:
            return "int4_awq"  # AWQ packs the output dim
        if qweight.shape[1] == scales.shape[1]:
            return "int4_gptq"  # GPTQ packs the input dim
    return "int4_pack"


def logical_params(scheme: str, role: str, dtype: str, elements: int) -> int:
    """Logical weight values stored in ``elements`` elements of a weight tensor of ``scheme``."""
    if role != "weight" or dtype in ("F4", "F6_E2M3", "F6_E3M2"):
        return elements  # sub-byte dtypes already count logical elements
    return elements * PACK_FACTOR.get(scheme, 1)
