"""Repos for the test Hub server: tiny sharded checkpoints with real safetensors headers, and an
isolated HF cache per test."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def isolate_hf(monkeypatch: Any, home: Path) -> None:
    """Point huggingface_hub at a temporary HF_HOME, also for its import-time constants (so nothing a
    test downloads lands in the user's real cache), and clear token / offline / endpoint settings."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(home))
    # The tool's own caches (headers read from the Hub: sources/header_cache.py) beside it, per test.
    monkeypatch.setenv("CKPTINSPECT_CACHE_DIR", str(home.parent / f"{home.name}-ckptinspect-cache"))
    monkeypatch.setenv("CKPTINSPECT_HEADER_CACHE", "1")  # off elsewhere in the session (conftest.py)
    # The caches' MAC key (ckptinspect/cache_auth.py) outside that cache directory, never the user's own.
    monkeypatch.setenv("CKPTINSPECT_CACHE_KEY_FILE", str(home.parent / f"{home.name}-config" / "cache-key"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # huggingface_hub reads the variable at import


# -- fixture repo builders (tiny safetensors written in the test, sparse data) ----------------------
def write_safetensors(path: Path, names: list[str], *, header_len: int | None = None,
                      tensor_bytes: int = 4096, shape: tuple[int, ...] = (64, 32)) -> bytes:
    """Write a safetensors file whose data region is sparse (zeros); return the header JSON bytes.

    ``header_len`` pads the JSON with spaces to exactly that many bytes (ValueError if it does not fit);
    otherwise it is padded to a multiple of 8 like the reference writer. ``tensor_bytes`` must equal
    prod(shape) * 2 for a valid BF16 header; the defaults do.
    """
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        entries[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + tensor_bytes]}
        offset += tensor_bytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    target = header_len if header_len is not None else len(text) + (-len(text) % 8)
    if len(text) > target:
        raise ValueError(f"{len(names)} tensors need {len(text)} header bytes > {target}")
    text += b" " * (target - len(text))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        fh.truncate(8 + len(text) + offset)
    return text


def names_for_header(header_len: int, prefix: str = "model.layers.0.mlp.experts",
                     tensor_bytes: int = 4096) -> list[str]:
    """As many tensor names as fit in a ``header_len``-byte header written by write_safetensors."""
    names: list[str] = []
    length = len(json.dumps({"__metadata__": {"format": "pt"}}, separators=(",", ":")))
    while True:
        name = f"{prefix}.{len(names)}.down_proj.weight"
        offset = tensor_bytes * len(names)
        entry = {name: {"dtype": "BF16", "shape": [64, 32], "data_offsets": [offset, offset + tensor_bytes]}}
        grow = len(json.dumps(entry, separators=(",", ":"))) - 2 + 1  # minus braces, plus a comma
        if length + grow > header_len:
            return names
        length += grow
        names.append(name)


def make_sharded_repo(root: Path, *, shards: int = 3, layers_per_shard: int = 2, experts: int = 16,
                      config: dict[str, Any] | None = None, extra_json: dict[str, Any] | None = None) -> dict[str, bytes]:
    """A Hub-style sharded repo (config.json, index, shards); returns shard -> header bytes."""
    root.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    headers: dict[str, bytes] = {}
    layer = 0
    for s in range(1, shards + 1):
        shard = f"model-{s:05d}-of-{shards:05d}.safetensors"
        names = []
        for _ in range(layers_per_shard):
            names += [f"model.layers.{layer}.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
            names += [f"model.layers.{layer}.mlp.experts.{e}.{p}.weight" for e in range(experts)
                      for p in ("gate_proj", "up_proj", "down_proj")]
            layer += 1
        headers[shard] = write_safetensors(root / shard, names)
        weight_map.update({n: shard for n in names})
    total = sum(4096 * len([n for n in weight_map if weight_map[n] == s]) for s in headers)
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    cfg = config or {"architectures": ["TinyMoeForCausalLM"], "model_type": "tiny_moe",
                     "num_hidden_layers": layer, "hidden_size": 64}
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    (root / "README.md").write_text("# tiny test repo\n")
    for name, value in (extra_json or {}).items():
        (root / name).write_text(json.dumps(value))
    return headers
