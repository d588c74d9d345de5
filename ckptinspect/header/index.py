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
