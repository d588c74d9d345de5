"""The dry-load request: the checkpoint's JSON files and every stored tensor's name, dtype and shape, read
from the safetensors headers (local, HF cache, Hub or snapshot: headers only), each flagged when the
checkpoint's family puts it in the MTP layer (the same prefix templates the inventory uses).

On the wire the tensors are columnar (``encode_request``): ``tensor_names`` (every name, in order),
``tensor_kinds`` (the distinct ``[dtype, shape, is_mtp]`` triples) and ``tensor_kind`` (each tensor's index
into them). A 400B-class checkpoint has ~370,000 tensors but a few hundred kinds, so the request is about
half the bytes of one ``[name, dtype, shape, is_mtp]`` row per tensor and the engine's Python decodes
strings and small integers instead of 370,000 lists (BENCHMARKS.md, verify). ``tensor_rows`` is the row
form, the reference the columnar one is checked against (tests/test_verify_request.py)."""

from __future__ import annotations

import math
from typing import Any

from ckptinspect.header.parser import parse_header
from ckptinspect.inventory.mtp_prefix import MtpPrefix, assign_mtp
from ckptinspect.inventory.scan import _NUMERIC_SEGMENT, _shape_of
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


def tensor_columns(raw: RawCheckpoint, prefixes: tuple[MtpPrefix, ...],
                   layers: int) -> tuple[list[str], list[list[Any]], list[int]]:
    """(names, kinds, kind index per name): ``tensor_rows`` columnar, the same tensors in the same order.
    The group pattern comes from one ``re.sub`` (what ``_shape_of`` builds from split / finditer, for a
    name without braces; one with braces takes ``_shape_of`` itself)."""
    names: list[str] = []
    kind_of: list[int] = []
    kinds: dict[tuple[str, tuple[int, ...], bool], int] = {}
    mtp_of: dict[tuple[str, int | None], bool] = {}
    sub, search = _NUMERIC_SEGMENT.sub, _NUMERIC_SEGMENT.search
    for shard, data in raw.headers.items():
        header = parse_header(data, source=f"{raw.location}/{shard}", file_size=None)
        names.extend(header.names)
        for name, dtype, shape in zip(header.names, header.dtypes, header.shapes):
            if "{" in name or "}" in name:
                pattern, spans = _shape_of(name)
                index = int(name[spans[0][0]:spans[0][1]]) if spans else None
            else:
                first = search(name)
                pattern, index = (sub(".{}", name), int(first.group(1))) if first is not None else (name, None)
            key = (pattern, index)
            flag = mtp_of.get(key)
            if flag is None:
                flag = mtp_of[key] = assign_mtp(pattern, index, prefixes, layers) is not None
            kind = (dtype, tuple(shape), flag)
            at = kinds.get(kind)
            if at is None:
                at = kinds[kind] = len(kinds)
            kind_of.append(at)
    return names, [[dtype, list(shape), flag] for dtype, shape, flag in kinds], kind_of


def build_request(raw: RawCheckpoint, prefixes: tuple[MtpPrefix, ...], layers: int, *,
                  method: str | None = None, trust_remote_code: bool = False) -> dict[str, Any]:
    json_files = {name: raw.json_files[name] for name in ENGINE_JSON_FILES if raw.json_files.get(name) is not None}
    names, kinds, kind_of = tensor_columns(raw, prefixes, layers)
    return {"json_files": json_files, "tensor_names": names, "tensor_kinds": kinds, "tensor_kind": kind_of,
            "method": method, "trust_remote_code": trust_remote_code}


def request_rows(request: dict[str, Any]) -> list[tuple[str, str, list[int], bool]]:
    """The columnar request's rows (engine_side/_dryload_common.py request_rows does the same there)."""
    kinds = request["tensor_kinds"]
    return [(name, *kinds[k]) for name, k in zip(request["tensor_names"], request["tensor_kind"])]


def encode_request(request: dict[str, Any]) -> bytes:
    """The request as compact JSON bytes (msgspec), or json's when a JSON file holds a non-finite float:
    msgspec writes ``inf`` / ``nan`` as null, and released configs carry them (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8
    ``time_step_limit: [0.0, Infinity]``; transformers' NemotronHConfig refuses ``[0.0, None]``), so the engine
    must read the file's own values. json writes them as ``Infinity`` / ``NaN``, which the engine side's json
    reads back (engine_side/_dryload_common.py read_request falls back to json when msgspec refuses)."""
    import msgspec

    jobs = request.get("jobs") or [request]  # a batch ({"jobs": [...]}, verify_many) or one request
    if any(_has_non_finite(job.get("json_files")) for job in jobs):
        import json

        return json.dumps(request, separators=(",", ":")).encode("utf-8")
    return msgspec.json.encode(request)


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False
