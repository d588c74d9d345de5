"""The index summary (header/index.py) that sizes the Hub header reads and cross-checks the
headers: its run-wise sums equal a name-at-a-time reference, whatever the order of the weight map."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptinspect.header.index import HASH_MASK, summarize_index

SHARDS = [f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)]
NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


def _reference(weight_map: dict[str, str]) -> tuple[dict, dict, dict]:
    counts: dict[str, int] = {}
    lengths: dict[str, int] = {}
    hashes: dict[str, int] = {}
    for name, shard in weight_map.items():
        counts[shard] = counts.get(shard, 0) + 1
        lengths[shard] = lengths.get(shard, 0) + len(name)
        hashes[shard] = (hashes.get(shard, 0) + hash(name)) & HASH_MASK
    return counts, lengths, hashes


@settings(max_examples=300, deadline=None)
@given(names=st.lists(NAMES, min_size=1, max_size=300), picks=st.lists(st.integers(0, 6), min_size=300,
                                                                       max_size=300), sort=st.booleans())
def test_summary_equals_the_name_at_a_time_reference(names, picks, sort):
    # sorted picks: shards in runs (the run-wise path, which needs >= 4 names per run: at least 120
    # names); unsorted: interleaved (the per-name path). The index prefix makes the names unique.
    if sort:
        names = (names * (1 + 120 // len(names)))[:max(len(names), 120)]
    names = [f"{i}.{name}" for i, name in enumerate(names)]
    weight_map = {name: SHARDS[pick] for name, pick in zip(names, sorted(picks) if sort else picks)}
    summary = summarize_index({"metadata": {"total_size": 5}, "weight_map": weight_map}, source="index")
    counts, lengths, hashes = _reference(weight_map)
    assert summary.shards == tuple(dict.fromkeys(weight_map.values()))
    assert dict(summary.counts) == counts and dict(summary.name_bytes) == lengths
    assert dict(summary.name_hashes) == hashes and summary.total_size == 5


def test_both_paths_on_a_large_map():
    names = [f"model.layers.{i // 500}.mlp.experts.{i % 500}.w" for i in range(20_000)]
    for shard_of in (lambda i: SHARDS[i * 7 // 20_000], lambda i: SHARDS[i % 7]):  # runs, interleaved
        weight_map = {name: shard_of(i) for i, name in enumerate(names)}
        summary = summarize_index({"weight_map": weight_map}, source="index")
        assert (dict(summary.counts), dict(summary.name_bytes), dict(summary.name_hashes)) == _reference(weight_map)
