"""The quantization method name the engines derive from a checkpoint's declaration.

Rule files speak the engines' vocabulary (``modelopt_fp4``, ``modelopt_mixed``, ``fp8``,
``compressed-tensors``, ``quark``, ...). SGLang's detection order
(sgl-project/sglang:python/sglang/srt/configs/model_config.py ``_parse_quant_hf_config``, summarised in
checkpoint_formats §4.1): ModelOpt ``quant_algo`` MIXED_PRECISION with ``quantized_layers`` ->
``modelopt_mixed``; bare MIXED_PRECISION -> ``w4afp8``; an algo containing FP4 -> ``modelopt_fp4``;
FP8 -> ``modelopt_fp8``; any other ``quant_method`` is used as written.
"""

from __future__ import annotations

from ckptinspect.records import DeclaredQuant


def engine_method(declared: DeclaredQuant) -> str | None:
    method = (declared.method or "").lower() or None
    algo = (declared.algo or "").upper()
    if method is None and not algo:
        return None
    if method in (None, "modelopt", "modelopt_fp4", "modelopt_fp8", "modelopt_mixed"):
        if method not in (None, "modelopt"):
            return method
        if algo == "MIXED_PRECISION":
            return "modelopt_mixed" if declared.quantized_layers else "w4afp8"
        if "FP4" in algo:
            return "modelopt_fp4"
        if "FP8" in algo:
            return "modelopt_fp8"
        return "modelopt"
    return method
