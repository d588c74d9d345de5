"""The model.safetensors.index.json format: pure functions over a parsed index, no I/O.

Every source summarizes its index here, once (sources/local.py, hf_cache.py, snapshot.py, hub.py), and the
scan stage reads that summary from the RawCheckpoint: the index is parsed and summarized once per report.

A 370k-tensor index is a 41 MB JSON file; the report needs only its shard list, the number and total
length of the names per shard (to size the Hub header reads) and an order-independent fingerprint of
those names (to cross-check the headers).
"""

from __future__ import annotations

import os
from itertools import groupby
from typing import Any

from ckptinspect.errors import ConfigError
from ckptinspect.records import IndexSummary

INDEX = "model.safetensors.index.json"
HASH_MASK = 0xFFFFFFFFFFFFFFFF

# Mistral's own ("consolidated") format: params.json instead of config.json, consolidated*.safetensors shards
# and their index. vLLM 0.34.0 reads a checkpoint this way when both are there, ahead of config.json
# (VL:transformers_utils/config.py:934-945 get_config, config_format "auto": is_mistral_model_repo, i.e. a
# file whose base name matches consolidated*.safetensors anywhere in the repo, VL:transformers_utils/
# repo_utils.py:196-206, 230-242, and a top-level params.json), and then loads only the top-level
# consolidated*.safetensors files, filtered by consolidated.safetensors.index.json when it exists
# (VL:model_executor/model_loader/default_loader.py:170-199 load_format "auto" -> "mistral",
# 228-255; weight_utils.py:620-645 filter_duplicate_safetensors_files).
PARAMS = "params.json"
MISTRAL_INDEX = "consolidated.safetensors.index.json"


def is_mistral_shard(name: str) -> bool:
    """A file vLLM's Mistral format loads: base name consolidated*.safetensors (fnmatch, case as written)."""
    base = name.rsplit("/", 1)[-1]
    return base.startswith("consolidated") and base.endswith(".safetensors")


def is_mistral_format(files: "Any") -> bool:
    """vLLM's choice for a checkpoint whose relative file names are ``files``: params.json at the top and a
    consolidated*.safetensors file anywhere (then params.json wins over any config.json)."""
    names = set(files)
    return PARAMS in names and any(is_mistral_shard(n) for n in names)


def index_name(files: "Any") -> str:
    """The index file the engines read for these files: Mistral's in its format, else the Hugging Face one."""
    return MISTRAL_INDEX if is_mistral_format(files) else INDEX


def shard_names_from_index(index: Any, *, source: str = INDEX) -> tuple[str, ...]:
    """The unique shard files named by an index's weight_map, in first-seen order, validated."""
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise ConfigError("has no 'weight_map' object", path=source)
    try:
        shards = dict.fromkeys(index["weight_map"].values())
    except TypeError:  # an unhashable (list / object) value
        raise ConfigError("weight_map values must be file names", path=source) from None
    for shard in shards:
        check_relative_name(shard, source=source)
    return tuple(shards)


def check_relative_name(name: Any, *, source: str) -> None:
    """Reject index entries that are not plain relative paths inside the checkpoint."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ConfigError(f"weight_map names a shard {name!r} that is not a file name", path=source)
    if name.endswith(("/", os.sep)):  # normpath would drop it: "shard.safetensors/" names a directory
        raise ConfigError(f"weight_map entry '{name}' ends with a slash: a directory, not a shard file", path=source)
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep) or "\\" in name:
        raise ConfigError(f"weight_map entry '{name}' points outside the checkpoint directory", path=source)


def summarize_index(index: Any, *, source: str) -> IndexSummary:
    """Summarize a parsed index (validates shard names: no paths escaping the checkpoint)."""
    shards = shard_names_from_index(index, source=source)
    acc: dict[str, list[int]] = {shard: [0, 0, 0] for shard in shards}
    weight_map = index["weight_map"]
    # An index lists its names sorted, so a shard's names come in runs (4,504 runs for the 371k names of
    # the Qwen3.5-397B replica): per run, counting, lengths and hashes are C-level maps over a slice.
    runs = [(shard, len(list(run))) for shard, run in groupby(weight_map.values())]
    if len(runs) * 4 > len(weight_map):  # mostly interleaved: one name at a time is cheaper
        for name, shard in weight_map.items():
            entry = acc[shard]
            entry[0] += 1
            entry[1] += len(name)  # names are ASCII in practice; JSON escapes are covered by the read margin
            entry[2] += hash(name)
    else:
        names = list(weight_map)
        start = 0
        for shard, count in runs:
            chunk = names[start:start + count]
            start += count
            entry = acc[shard]
            entry[0] += count
            entry[1] += sum(map(len, chunk))
            entry[2] += sum(map(hash, chunk))
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return IndexSummary(
        shards=shards, counts={s: a[0] for s, a in acc.items()}, name_bytes={s: a[1] for s, a in acc.items()},
        name_hashes={s: a[2] & HASH_MASK for s, a in acc.items()},
        total_size=total if isinstance(total, int) and not isinstance(total, bool) else None,
    )
