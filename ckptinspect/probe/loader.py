"""Checkpoint directory -> main model in transformers (+ the MTP layer's raw tensors).

Pre-quantized formats transformers cannot load (ModelOpt NVFP4 is refused; FP8-block and MXFP4 need
GPU kernels) are dequantized with ``dequant.py`` into a temporary BF16 copy (never inside the model
directory), which transformers then loads with its own renames and weight conversions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import dequant
from ckptinspect.probe.options import EXPERTS_IMPLEMENTATIONS
from ckptinspect.quant.detect import PACK_FACTOR, Part, detect_scheme

_COMPANIONS = ("weight_scale", "weight_scale_2", "input_scale", "weight_scale_inv", "k_scale", "v_scale",
               "weight_global_scale", "input_global_scale")
# The tensor that holds a module's weight, by layout (quant/detect.py reads the same names); the
# packed ones (compressed-tensors, GPTQ / AWQ) have no dequantizer here.
_PACKED_WEIGHTS = (".weight_packed", ".qweight")
_WEIGHT_SUFFIXES = (".weight", *_PACKED_WEIGHTS)
DEQUANTIZERS = frozenset({"nvfp4", "fp8_block", "fp8_scaled", "mxfp4"})
_MODULE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".weight_global_scale", ".g_idx",
                    ".scales", ".qzeros")


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str
    nbytes: int  # from data_offsets (exact for packed dtypes)


def resolve_model_dir(ref: str) -> str:
    if os.path.isdir(ref):
        return os.path.abspath(ref)
    if re.fullmatch(r"[\w.-]+/[\w.-]+(@[\w./-]+)?", ref):
        from huggingface_hub import snapshot_download

        repo, _, rev = ref.partition("@")
        try:
            return snapshot_download(repo, revision=rev or None, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - huggingface_hub raises several types here
            raise ProbeError("not a local directory and not in the Hugging Face cache "
                             "(the probe needs the weights; download them first)", path=ref) from exc
    raise ProbeError("not a checkpoint directory", path=ref)


def read_config(model_dir: str) -> dict[str, Any]:
    from ckptinspect.guarded_file import read_json

    path = os.path.join(model_dir, "config.json")
    if not os.path.lexists(path):
        raise ProbeError("config.json not found", path=model_dir)
    # The guarded reader and the bounded decoder, as `report` reads it (16 MiB, the same cap).
    config = read_json(path, what="config.json", cap=16 * 1024 * 1024, error=ProbeError)
    if not isinstance(config, dict):
        raise ProbeError("config.json is not a JSON object", path=path)
    return config


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def quant_kind(name: str, metas: Mapping[str, TensorMeta]) -> str | None:
    """How tensor ``name`` is stored, as the loader must treat it: a dequantizer (nvfp4 | fp8_block |
    fp8_scaled | mxfp4), ``companion`` (a scale folded into its weight), ``unsupported:<scheme>`` (a
    packed format with no dequantizer here), or None (loaded as is). The scheme itself is decided by
    quant/detect.py, the same code that labels the report's tensor groups."""
    base, _, leaf = name.rpartition(".")
    if leaf in _COMPANIONS or name.endswith("_scales"):
        return "companion"
    if name.endswith("_blocks"):
        stem = name[: -len("_blocks")]
        parts = {"_blocks": _part(metas[name], "_blocks")}
        if stem + "_scales" in metas:
            parts["_scales"] = _part(metas[stem + "_scales"], "_scales")
        return "mxfp4" if detect_scheme(parts) == "mxfp4" else None
    suffix = "." + leaf
    if suffix not in _WEIGHT_SUFFIXES:
        return "companion" if any(f"{base}{w}" in metas for w in _PACKED_WEIGHTS) else None
    parts = {sfx: _part(metas[base + sfx], sfx) for sfx in (suffix, *_MODULE_SUFFIXES) if base + sfx in metas}
    scheme = detect_scheme(parts)
    if suffix in _PACKED_WEIGHTS:
        return f"unsupported:{scheme}"
    if scheme in ("fp8_tensor", "fp8_channel"):
        return "fp8_scaled" if ".weight_scale" in parts else None  # no scale at all: a plain cast
    return scheme if scheme in ("nvfp4", "fp8_block") else None


def _part(meta: TensorMeta, suffix: str) -> Part:
    return Part(role="weight" if suffix in _WEIGHT_SUFFIXES else "scale", suffix=suffix, dtype=meta.dtype,
                shape=meta.shape, tensors=1)


def logical_params(metas: Mapping[str, TensorMeta], keep: Callable[[str], bool] = lambda n: True) -> int:
    """Weight elements after dequantization (packed FP4 holds two per byte; companions count 0)."""
    total = 0
    for name, meta in metas.items():
        if not keep(name):
            continue
        kind = quant_kind(name, metas)
        if kind == "companion":
            continue
        total += _numel(meta.shape) * PACK_FACTOR.get(kind.removeprefix("unsupported:") if kind else "", 1)
    return total


def stored_bytes(metas: Mapping[str, TensorMeta], keep: Callable[[str], bool] = lambda n: True) -> int:
    return sum(m.nbytes for n, m in metas.items() if keep(n))


def needs_dequant(metas: Mapping[str, TensorMeta]) -> bool:
    """Whether a BF16 copy must be written first. Packed formats without a dequantizer here
    (``unsupported:*``) are left to transformers' own loader and its quantization integrations."""
    return any(quant_kind(n, metas) in DEQUANTIZERS for n in metas)


_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                 "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def data_offsets(path: str) -> dict[str, tuple[int, int]]:
    """(start, end) file offsets of each tensor's bytes in a safetensors file (its header read once)."""
    try:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
    except (OSError, ValueError) as exc:
        raise ProbeError(f"cannot read the safetensors header ({exc})", path=path) from exc
    base = 8 + size
    return {k: (base + v["data_offsets"][0], base + v["data_offsets"][1]) for k, v in header.items()
            if k != "__metadata__"}


def read_stored(model_dir: str, metas: Mapping[str, TensorMeta], names: list[str], buffer: torch.Tensor,
                offsets: dict[str, dict[str, tuple[int, int]]]) -> dict[str, torch.Tensor] | None:
    """The stored (undequantized) tensors ``names``, read from their shards into ``buffer`` (a uint8
    host tensor, pinned where the caller wants an asynchronous copy to a GPU): one ``readinto`` per run
    of adjacent tensors, which releases the interpreter lock while the disk works, so a caller's
    thread overlaps it with computation. Returns views of ``buffer`` (valid until it is reused), or
    None when a dtype has no torch equivalent or the buffer is too small (the caller reads through
    safetensors instead). ``offsets`` caches each shard's header."""
    spans = []
    for name in names:
        meta = metas[name]
        if meta.dtype not in _TORCH_DTYPES:
            return None
        if meta.shard not in offsets:
            offsets[meta.shard] = data_offsets(os.path.join(model_dir, meta.shard))
        start, end = offsets[meta.shard][name]
        spans.append((meta.shard, start, end, name))
    spans.sort()
    if sum(end - start for _, start, end, _ in spans) > buffer.numel():
        return None
    view = memoryview(buffer.numpy()) if buffer.numel() else memoryview(b"")
    out: dict[str, torch.Tensor] = {}
    at = 0
    i = 0
    while i < len(spans):  # a run: tensors that follow each other in one shard, read in one call
        shard, start, end, _ = spans[i]
        j = i + 1
        while j < len(spans) and spans[j][0] == shard and spans[j][1] == end:
            end = spans[j][2]
            j += 1
        with open(os.path.join(model_dir, shard), "rb", buffering=0) as fh:
            fh.seek(start)
            got, want = 0, end - start
            while got < want:
                n = fh.readinto(view[at + got:at + want])
                if not n:
                    raise ProbeError(f"file ends inside tensor data (offset {start + got})",
                                     path=os.path.join(model_dir, shard))
                got += n
        for _, s, e, name in spans[i:j]:
            meta = metas[name]
            raw = buffer[at + s - start:at + e - start]
            out[name] = raw.view(_TORCH_DTYPES[meta.dtype]).view(meta.shape) if e > s else torch.empty(
                meta.shape, dtype=_TORCH_DTYPES[meta.dtype])
        at += end - start
        i = j
    return out


def iter_tensors(model_dir: str, metas: Mapping[str, TensorMeta], keep: Callable[[str], bool],
                 dtype: torch.dtype, device: Any = "cpu",
                 stored: Mapping[str, torch.Tensor] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for kept tensors, dequantized to ``dtype``, companions folded in. The
    stored bytes are read straight onto ``device`` and dequantized there (a GPU does it in place of
    the CPU). Only tensors in ``metas`` (the report inventory's, in the index's shards) are read.
    ``stored``: tensors already read (``read_stored``, or copied to the device ahead), used in place of
    the shards for the names it holds."""
    from safetensors import safe_open

    by_shard: dict[str, list[str]] = {}
    for name, meta in metas.items():
        if keep(name) and quant_kind(name, metas) != "companion":
            by_shard.setdefault(meta.shard, []).append(name)
    handles: dict[str, Any] = {}

    def get(name: str) -> torch.Tensor:
        if stored is not None and name in stored:
            return stored[name]
        shard = metas[name].shard
        if shard not in handles:
            handles[shard] = safe_open(os.path.join(model_dir, shard), framework="pt", device=str(device))
        return handles[shard].get_tensor(name)

    for shard in sorted(by_shard):
        for name in sorted(by_shard[shard]):
            kind = quant_kind(name, metas)
            base = name.rpartition(".")[0]
            if kind is not None and kind.startswith("unsupported:"):
                raise ProbeError(f"tensor '{name}' is stored as {kind.split(':', 1)[1]}, which the probe cannot "
                                 "dequantize (supported: ModelOpt NVFP4, FP8 per-tensor / channel / block, MXFP4)",
                                 path=model_dir)
            if kind == "nvfp4":
                t = dequant.dequant_nvfp4(get(name), get(f"{base}.weight_scale"), get(f"{base}.weight_scale_2"))
            elif kind == "fp8_block":  # DeepSeek names the block scale weight_scale_inv, compressed-tensors weight_scale
                scale = f"{base}.weight_scale_inv" if f"{base}.weight_scale_inv" in metas else f"{base}.weight_scale"
                t = dequant.dequant_fp8_block(get(name), get(scale))
            elif kind == "fp8_scaled":
                t = dequant.dequant_fp8_scaled(get(name), get(f"{base}.weight_scale"))
            elif kind == "mxfp4":
                stem = name[: -len("_blocks")]
                t = dequant.dequant_mxfp4(get(name), get(stem + "_scales"))
                name = stem
            else:
                t = get(name)
            yield name, (t.to(dtype) if t.is_floating_point() else t)


def write_dequantized_copy(model_dir: str, metas: Mapping[str, TensorMeta], out_dir: str,
                           dtype: torch.dtype, progress: bool = True) -> None:
    """A BF16 (or ``dtype``) copy of the checkpoint in ``out_dir`` with quantization_config removed."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    shards = sorted({m.shard for m in metas.values()})
    weight_map: dict[str, str] = {}
    for shard in tqdm(shards, desc="dequantize", unit="shard", disable=not progress, file=None):
        keep = lambda n, s=shard: metas[n].shard == s  # noqa: E731
        tensors = {n: t.contiguous() for n, t in iter_tensors(model_dir, metas, keep, dtype)}
        save_file(tensors, os.path.join(out_dir, shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in tensors})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    config = read_config(model_dir)
    config.pop("quantization_config", None)
    if isinstance(config.get("text_config"), dict):
        config["text_config"].pop("quantization_config", None)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=1)
    for f in os.listdir(model_dir):
        if f.endswith((".json", ".jinja", ".txt", ".model", ".tiktoken")) and f not in (
                "config.json", "model.safetensors.index.json", "hf_quant_config.json"):
            shutil.copy(os.path.join(model_dir, f), os.path.join(out_dir, f))


def prepare_loadable_dir(model_dir: str, metas: Mapping[str, TensorMeta], dtype: torch.dtype,
                         progress: bool = True) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """The directory transformers should load, plus the temp dir to clean up (None when original)."""
    if not needs_dequant(metas):
        return model_dir, None
    tmp = tempfile.TemporaryDirectory(prefix="ckptinspect-probe-")
    write_dequantized_copy(model_dir, metas, tmp.name, dtype, progress)
    return tmp.name, tmp


def load_main_model(load_dir: str, config: Mapping[str, Any], *, main_model_type: str | None,
                    device_map: Any, dtype: torch.dtype, trust_remote_code: bool):
    from transformers import AutoConfig, AutoModelForCausalLM, CONFIG_MAPPING

    single = isinstance(device_map, dict) and set(device_map) == {""}
    # One device: load then move (no accelerate needed); several: transformers' device_map="auto".
    kwargs: dict[str, Any] = {"dtype": dtype} if single else {"dtype": dtype, "device_map": device_map}
    if main_model_type:
        # A family whose main model is a built-in architecture behind a remote-code wrapper (MiMo-7B
        # = Qwen2 + MTP layers): build the built-in config from the same keys, no remote code runs.
        cfg_dict = {k: v for k, v in config.items() if k not in ("auto_map", "architectures", "model_type")}
        kwargs["config"] = CONFIG_MAPPING[main_model_type](**cfg_dict)
    else:
        kwargs["config"] = AutoConfig.from_pretrained(load_dir, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(load_dir, trust_remote_code=trust_remote_code, **kwargs)
    except ValueError as exc:
        if "accelerate" in str(exc):
            raise ProbeError("several --devices need the 'accelerate' package (pip install accelerate)") from exc
        raise
    if single:
        model.to(device_map[""])
    model.eval()
    return model


def set_experts_implementation(model, requested: str, *, decode_on_gpu: bool) -> dict[str, str | None]:
    """Run the MoE experts with transformers' ``requested`` implementation (integrations/moe.py);
    "auto" keeps transformers' own choice: ``grouped_mm`` where the class supports it, which
    ``generate`` switches to ``batched_mm`` while decoding on a GPU (generation/utils.py
    ``_optimize_model_for_decode``). Returns what the forward and the decode steps run with; None
    for a model without swappable experts (dense, or a class without ``@use_experts_implementation``)."""
    if requested not in EXPERTS_IMPLEMENTATIONS:
        raise ProbeError(f"unknown experts implementation {requested!r} (one of {', '.join(EXPERTS_IMPLEMENTATIONS)})")
    swappable = model._can_set_experts_implementation()
    if requested != "auto":
        if not swappable and requested != "eager":
            raise ProbeError(f"--experts-implementation {requested}: {type(model).__name__} has no swappable MoE "
                             "experts in this transformers (only 'auto' or 'eager' apply)")
        try:
            model.set_experts_implementation(requested)
        except (ValueError, ImportError) as exc:  # transformers' own refusal, e.g. no grouped_mm kernel
            raise ProbeError(f"--experts-implementation {requested}: transformers refused it ({exc})") from exc
    if not swappable:
        return {"requested": requested, "forward": None, "decode": None}
    impls = model.get_experts_implementation()  # {"": top config, sub-config name: ...} (a VLM's text_config)
    forward = impls.get("") or next((v for v in impls.values() if v), None)
    decode = "batched_mm" if decode_on_gpu and forward == "grouped_mm" else forward
    return {"requested": requested, "forward": forward, "decode": decode}
