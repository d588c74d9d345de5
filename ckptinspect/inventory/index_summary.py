"""What the report needs from model.safetensors.index.json, in a few kilobytes.

A 370k-tensor index is a 41 MB JSON file; only its shard list, the number of names per shard and an
order-independent fingerprint of those names are needed to cross-check the headers. Computing them
where the index is parsed (a worker process for large local checkpoints) keeps the 370k-entry dict
out of the main process.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ckptinspect.sources.interface import gc_paused, parse_json_bytes, shard_names_from_index

HASH_MASK = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class IndexSummary:
    shards: tuple[str, ...]  # unique shard files in first-seen order
    counts: Mapping[str, int]  # shard -> tensor names mapped to it
    name_hashes: Mapping[str, int]  # shard -> sum of hash(name) & HASH_MASK (same process family only)
    total_size: int | None  # metadata.total_size as written


def summarize_index(index: Any, *, source: str) -> IndexSummary:
    """Summarize a parsed index (validates shard names: no paths escaping the checkpoint)."""
    shards = shard_names_from_index(index, source=source)
    weight_map = index["weight_map"]
    hashes: dict[str, int] = defaultdict(int)
    for name, shard in weight_map.items():
        hashes[shard] += hash(name)
    total = (index.get("metadata") or {}).get("total_size")
    return IndexSummary(
        shards=shards, counts=dict(Counter(weight_map.values())),
        name_hashes={s: h & HASH_MASK for s, h in hashes.items()},
        total_size=total if isinstance(total, int) and not isinstance(total, bool) else None,
    )


def summarize_index_file(path: Path) -> IndexSummary:
    """Read, parse and summarize an index file (run in a worker process for large checkpoints)."""
    with gc_paused():
        index = parse_json_bytes(path.read_bytes(), source=str(path))
        return summarize_index(index, source=str(path))
