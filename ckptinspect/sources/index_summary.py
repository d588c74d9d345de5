"""What the report needs from model.safetensors.index.json, in a few kilobytes.

A 370k-tensor index is a 41 MB JSON file; only its shard list, the number and total length of the names
per shard (to size the Hub header reads) and an order-independent fingerprint of those names (to
cross-check the headers) are needed. Computing them where the index is parsed (a worker process, or the
Hub prefetch process) keeps the 370k-entry dict out of the main process.
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Any

from ckptinspect.records import IndexSummary
from ckptinspect.sources.interface import gc_paused, parse_json_bytes, read_file_bytes, shard_names_from_index

HASH_MASK = 0xFFFFFFFFFFFFFFFF


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


def summarize_index_bytes(data: bytes, *, source: str) -> IndexSummary:
    with gc_paused():
        return summarize_index(parse_json_bytes(data, source=source), source=source)


def summarize_index_file(path: Path) -> IndexSummary:
    """Read, parse and summarize an index file (run in a worker process for large checkpoints)."""
    return summarize_index_bytes(read_file_bytes(path), source=str(path))
