"""The dry-load request: the checkpoint's JSON files and every stored tensor's name, dtype and shape, read
from the safetensors headers (local, HF cache, Hub or snapshot: headers only), each flagged when the
checkpoint's family puts it in the MTP layer (the same prefix templates the inventory uses)."""

from __future__ import annotations

from typing import Any

from ckptinspect.header.parser import parse_header
from ckptinspect.inventory.mtp_prefix import MtpPrefix, assign_mtp
from ckptinspect.inventory.scan import _shape_of
from ckptinspect.records import RawCheckpoint

# The JSON files the engines read from a model directory (config, quantization configs).
ENGINE_JSON_FILES = ("config.json", "hf_quant_config.json", "quant_model_description.json", "generation_config.json")


def tensor_rows(raw: RawCheckpoint, prefixes: tuple[MtpPrefix, ...], layers: int) -> list[list[Any]]:
    """``[name, dtype, shape, is_mtp]`` for every tensor of every shard, in shard then header order
    (the order the engines' safetensors iterators yield them)."""
    rows: list[list[Any]] = []
    mtp_of: dict[tuple[str, int | None], bool] = {}
    for shard, data in raw.headers.items():
        header = parse_header(data, source=f"{raw.location}/{shard}", file_size=None)
        for name, dtype, shape in zip(header.names, header.dtypes, header.shapes):
            pattern, spans = _shape_of(name)
            index = int(name[spans[0][0]:spans[0][1]]) if spans else None
            key = (pattern, index)
            flag = mtp_of.get(key)
            if flag is None:
                flag = mtp_of[key] = assign_mtp(pattern, index, prefixes, layers) is not None
            rows.append([name, dtype, shape, flag])
    return rows


def build_request(raw: RawCheckpoint, prefixes: tuple[MtpPrefix, ...], layers: int, *,
                  method: str | None = None, trust_remote_code: bool = False) -> dict[str, Any]:
    json_files = {name: raw.json_files[name] for name in ENGINE_JSON_FILES if raw.json_files.get(name) is not None}
    return {"json_files": json_files, "tensors": tensor_rows(raw, prefixes, layers), "method": method,
            "trust_remote_code": trust_remote_code}
