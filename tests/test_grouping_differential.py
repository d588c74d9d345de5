"""The fast per-shard scan (digit-mask buckets) against a slow, obviously-correct per-name reference.

The reference splits every name on "." and treats a segment as numeric when it is a canonical decimal
(``0`` or ``[1-9][0-9]*``, at most 18 ASCII digits) and not the first segment; the pattern is the name
with those segments replaced by ``{}`` (literal braces doubled), the group key (pattern, first numeric
value), the rest of the numeric values the member's sub-indices. Both must agree exactly on groups,
counts, bytes, elements, dtypes, shapes and sub-indices, and every name must be rebuilt exactly from
its group (``pattern.format(index, *subs)``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ckptinspect.errors import CkptInspectError
from ckptinspect.inventory.scan import ShardScan, scan_header_unpaused
from fixtures.generate import FIXTURES

_ASCII_DIGITS = frozenset("0123456789")


def _numeric(segment: str) -> bool:
    return (0 < len(segment) <= 18 and set(segment) <= _ASCII_DIGITS
            and (segment == "0" or segment[0] != "0"))


def reference_groups(header: dict) -> dict:
    """(pattern, first) -> facts, one name at a time."""
    groups: dict = defaultdict(lambda: {"count": 0, "bytes": 0, "elements": 0, "dtypes": set(),
                                        "shapes": set(), "subs": []})
    for name, info in header.items():
        if name == "__metadata__":
            continue
        parts = name.split(".")
        numbers = []
        out = [parts[0].replace("{", "{{").replace("}", "}}")]
        for part in parts[1:]:
            if _numeric(part):
                out.append("{}")
                numbers.append(int(part))
            else:
                out.append(part.replace("{", "{{").replace("}", "}}"))
        key = (".".join(out), numbers[0] if numbers else None)
        g = groups[key]
        begin, end = info["data_offsets"]
        elements = 1
        for d in info["shape"]:
            elements *= d
        g["count"] += 1
        g["bytes"] += end - begin
        g["elements"] += elements
        g["dtypes"].add(info["dtype"])
        g["shapes"].add(tuple(info["shape"]))
        g["subs"].append(tuple(numbers[1:]))
    return {k: _normal(v["count"], v["bytes"], v["elements"], v["dtypes"], v["shapes"], v["subs"])
            for k, v in groups.items()}


def _normal(count, nbytes, elements, dtypes, shapes, subs) -> tuple:
    return (count, nbytes, elements, frozenset(dtypes), len(shapes) > 1,
            next(iter(shapes)) if len(shapes) == 1 else None, tuple(sorted(subs)))


def fast_groups(scan: ShardScan) -> dict:
    out = {}
    for key, t in scan.groups.items():
        count, nbytes, elements, dtype, shape, subs, mixed, varies = (
            t.tensors, t.bytes, t.elements, t.dtype, t.shape, t.subs, t.dtypes, t.shapes_vary)
        if not subs:
            member_subs = [()] * count
        elif isinstance(subs[0], int):
            member_subs = [(s,) for s in subs]
        else:
            member_subs = list(subs)
        assert len(member_subs) == count, key
        dtypes = mixed if mixed else {dtype}
        out[key] = (count, nbytes, elements, frozenset(dtypes), bool(varies),
                    None if varies else tuple(shape), tuple(sorted(member_subs)))
    return out


def rebuilt_names(scan: ShardScan) -> list[str]:
    names = []
    for (pattern, first), tally in scan.groups.items():
        subs = tally.subs
        if first is None:
            names.extend([pattern.format()] * tally.tensors)
        elif not subs:
            names.extend([pattern.format(first)] * tally.tensors)
        elif isinstance(subs[0], int):
            names.extend(pattern.format(first, s) for s in subs)
        else:
            names.extend(pattern.format(first, *s) for s in subs)
    return names


def header_bytes(entries: list[tuple[str, str, list[int]]]) -> tuple[bytes, dict]:
    """A valid header for (name, dtype, shape) entries, contiguous in the given order."""
    sizes = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
    header: dict = {}
    offset = 0
    for name, dtype, shape in entries:
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return json.dumps(header).encode(), header


def assert_agree(data: bytes, header: dict) -> ShardScan:
    scan = scan_header_unpaused("test.safetensors", data, None)
    assert fast_groups(scan) == reference_groups(header)
    assert sorted(rebuilt_names(scan)) == sorted(n for n in header if n != "__metadata__")
    return scan


# Segments chosen to hit every case the mask could confuse: digits embedded in words, numeric
# segments of several widths, leading zeros, over-long numbers, braces, non-ASCII digits and letters,
# empty segments, a literal '#' (the old mask character) and a mask-like high code point.
_SEGMENT = st.one_of(
    st.sampled_from(["model", "layers", "experts", "mlp", "w1", "w2", "w3", "fc1", "fc2", "linear_fc1",
                     "linear_fc2", "proj_1", "proj_2", "weight", "weight_scale", "weight_scale_inv", "scale",
                     "{}", "{x}", "}", "a#b", "a1b", "a2b", "٣", "層", "é1", "", "mtp", "0x1", "1e3", "\u00ff"]),
    st.integers(0, 300).map(str),
    st.sampled_from(["00", "01", "007", "0", "9" * 18, "1" + "0" * 18, "9" * 40]),
    st.text(alphabet="ab12_", min_size=1, max_size=4),
)
_NAME = st.lists(_SEGMENT, min_size=1, max_size=6).map(".".join)
_ENTRY = st.tuples(_NAME, st.sampled_from(["BF16", "F32", "U8", "F8_E4M3"]),
                   st.lists(st.integers(0, 3), min_size=0, max_size=3))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ENTRY, min_size=1, max_size=40, unique_by=lambda e: e[0]))
@example([("10.100", "BF16", []), ("00.007", "BF16", [])])  # same mask, one numeric segment, one text
@example([("a.007.w", "BF16", []), ("a.008.w", "BF16", []), ("a.108.w", "BF16", [])])
@example([("x.00", "F32", [1]), ("x.01", "F32", [1]), ("x.11", "F32", [1]), ("x.0", "F32", [1])])
@example([("m.w1.3", "BF16", []), ("m.w2.3", "BF16", []), ("m.w1.03", "BF16", [])])
@example([("a.1000000000000000000", "U8", [1]), ("a.2000000000000000000", "U8", [1])])  # 19 digits: text
@example([("a.0.1000000000000000000", "U8", [1]), ("a.0.2000000000000000000", "U8", [1]), ("a.1.1000000000000000000", "U8", [1])])
def test_fast_scan_equals_reference_on_generated_names(entries):
    data, header = header_bytes(entries)
    assert_agree(data, header)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["gate", "w", "fc", "proj_", "linear_fc", "x"]), min_size=1, max_size=3),
       st.integers(1, 12), st.integers(1, 4))
def test_prefix_families_and_embedded_digits(stems, experts, layers):
    """Dense families of names that differ only in digits, some being prefixes of others."""
    entries = []
    for layer in range(layers):
        base = f"model.layers.{layer}"
        entries.append((base, "BF16", [1]))
        for e in range(experts):
            for stem in stems:
                for j in (1, 2, 3, 13):
                    entries.append((f"{base}.experts.{e}.{stem}{j}.weight", "F8_E4M3", [2, 2]))
                    entries.append((f"{base}.experts.{e}.{stem}{j}.weight_scale_inv", "F32", [1, 1]))
    unique = list({e[0]: e for e in entries}.values())
    data, header = header_bytes(unique)
    scan = assert_agree(data, header)
    # w1 / w2 / w3 / w13 are separate groups, never one bucket's first pattern
    patterns = {p for p, _ in scan.groups}
    for stem in stems:
        for j in (1, 2, 3, 13):
            assert f"model.layers.{{}}.experts.{{}}.{stem}{j}.weight" in patterns


def test_minimax_block_sparse_moe_names_stay_apart():
    """The MiniMax / Mixtral naming that the digit mask used to merge (w1 / w2 / w3)."""
    entries = []
    for layer in range(3):
        for e in range(8):
            for w in ("w1", "w2", "w3"):
                stem = f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}"
                entries.append((f"{stem}.weight", "F8_E4M3", [4, 4]))
                entries.append((f"{stem}.weight_scale_inv", "F32", [1, 1]))
    data, header = header_bytes(entries)
    scan = assert_agree(data, header)
    keys = {(p, i) for p, i in scan.groups}
    for w in ("w1", "w2", "w3"):
        tally = scan.groups[(f"model.layers.{{}}.block_sparse_moe.experts.{{}}.{w}.weight", 0)]
        assert tally.tensors == 8 and tally.dtype == "F8_E4M3" and sorted(tally.subs) == list(range(8))
    assert len(keys) == 3 * 3 * 2


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fast_scan_equals_reference_on_every_fixture(name, make_fixture):
    root = make_fixture(name)
    shards = sorted(Path(root).rglob("*.safetensors"))
    checked = 0
    shards = [s for s in shards if not s.is_symlink() and s.is_file()]
    for shard in shards:
        blob = shard.read_bytes()
        if len(blob) < 8:
            continue
        length = int.from_bytes(blob[:8], "little")
        data = blob[8:8 + length]
        try:
            header = json.loads(data)
            scan = scan_header_unpaused(shard.name, data, len(blob))
        except (CkptInspectError, ValueError):  # broken fixtures: the parser's own tests cover rejection
            continue
        assert fast_groups(scan) == reference_groups(header), shard
        assert sorted(rebuilt_names(scan)) == sorted(n for n in header if n != "__metadata__")
        checked += 1
    if not FIXTURES[name].breaker:
        assert checked == len(shards) > 0


@pytest.mark.parametrize("name", sorted(n for n, spec in FIXTURES.items() if not spec.breaker and not n.startswith("broken_")))
def test_inventory_rebuilds_every_tensor_name(name, make_fixture):
    """End to end (every shard, merged across shards): the inventory's groups name exactly the tensors
    of the headers, so nothing downstream (findings, the probe's loader) misses or invents a tensor."""
    from ckptinspect.pipeline import build_report

    root = make_fixture(name)
    header_names = set()
    for shard in Path(root).glob("*.safetensors"):
        blob = shard.read_bytes()
        length = int.from_bytes(blob[:8], "little")
        header_names.update(k for k in json.loads(blob[8:8 + length]) if k != "__metadata__")
    inventory = build_report(str(root), progress=False).checkpoint.inventory
    rebuilt = [n for g in inventory.groups for n in g.names()]
    assert len(rebuilt) == len(set(rebuilt)) == inventory.totals.tensors
    assert set(rebuilt) == header_names
