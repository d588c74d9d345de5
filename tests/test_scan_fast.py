"""parse_header's fast path (header/typed.py: msgspec's typed decode, the sizes checked over whole columns)
against its exact path (``parse_header_exact``: header/exact.py and the per-entry checks).

``scan_header_unpaused`` scans what ``parse_header`` returns, which tries the fast path first. The scan
of the fast path's Header and of the exact path's must be the same on every header: the same
ShardScan, or the same HeaderError message; and so must the Headers' columns. The fast path may only
say "not proven" (None), never accept what the exact path refuses nor read differently, which these tests
check on the headers the safetensors library writes, on the conformance corpus (tests/test_conformance.py)
with its metadata moved to where the library writes it, and on generated headers, valid and invalid:
bools, -0, floats, negative and 64-bit-overflowing dims, missing / extra / repeated fields, repeated
names, non-list shapes, more than 8 dims, zero-element shapes with overflowing dims, offsets that leave
holes or overlap, and ``__metadata__`` of every type at the start, the end and in between.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from ckptinspect.errors import HeaderError
from ckptinspect.header.parser import DTYPE_BITS, parse_header, parse_header_exact
from ckptinspect.header.typed import plain_columns
from ckptinspect.inventory.scan import scan_header_unpaused, scan_of_header
from tests.test_conformance import CORPUS

SHARD = "s.safetensors"


def _outcome(scan, data: bytes, file_size: int | None):
    try:
        return scan(SHARD, data, file_size)
    except HeaderError as exc:
        return f"HeaderError: {exc}"


def _exact_scan(shard: str, data: bytes, file_size: int | None):
    return scan_of_header(shard, parse_header_exact(data, source=shard, file_size=file_size), file_size)


def _columns(parse, data: bytes, file_size: int | None):
    def read(shard, data, file_size):
        h = parse(data, source=shard, file_size=file_size)
        return [h.length, h.names, h.dtypes, h.shapes, h.sizes, h.begins, h.data_bytes, dict(h.metadata)]
    return _outcome(read, data, file_size)


def _typed(data: bytes, file_size: int | None):
    """The scan's answer when the fast path took the header; None when it left it to the exact path."""
    return None if plain_columns(data) is None else _outcome(scan_header_unpaused, data, file_size)


def assert_same(data: bytes, file_size: int | None):
    """Both paths give one answer; returns the fast path's scan (None: it left the header to the exact path)."""
    expected = _outcome(_exact_scan, data, file_size)
    assert _outcome(scan_header_unpaused, data, file_size) == expected
    assert _columns(parse_header, data, file_size) == _columns(parse_header_exact, data, file_size)
    typed = _typed(data, file_size)
    if typed is not None:
        assert typed == expected, "the fast path accepted what the exact path scans differently or refuses"
    return typed


def _header_of(blob: bytes) -> tuple[bytes, int]:
    (length,) = struct.unpack("<Q", blob[:8])
    return blob[8:8 + length], len(blob)


# --- headers the safetensors library writes: the typed path must take them -------------------------

_ARRAYS = {
    "model.embed_tokens.weight": np.zeros((8, 4), np.float16),
    "model.layers.0.mlp.experts.0.up_proj.weight": np.zeros((4, 2), np.uint8),
    "model.layers.0.mlp.experts.1.up_proj.weight": np.zeros((4, 2), np.uint8),
    "model.layers.0.mlp.experts.10.up_proj.weight": np.zeros((4, 2), np.uint8),
    "model.layers.0.mlp.experts.0.up_proj.weight_scale_2": np.zeros((), np.float32),
    "model.layers.0.mlp.experts.1.up_proj.weight_scale_2": np.zeros((), np.float32),
    "model.layers.1.mlp.experts.0.up_proj.weight": np.zeros((4, 3), np.uint8),  # shapes vary in a group
    "model.layers.1.mlp.experts.1.up_proj.weight": np.zeros((4, 2), np.int8),  # and dtypes
    "model.layers.1.self_attn.q_proj.weight": np.zeros((2, 0), np.float32),  # zero elements
    "model.layers.2.w1.weight": np.zeros((3,), np.int64),
    "model.layers.2.w2.weight": np.zeros((3,), np.int64),
    "model.layers.02.w2.weight": np.zeros((1,), np.bool_),
    "model.layers.3.experts.4.5.w": np.zeros((1, 1, 1, 1, 1, 1, 1, 1), np.float64),  # 8 dims, 3 indices
    "层.0.权重": np.zeros((2,), np.uint16),
    "lm_head.weight": np.zeros((8, 4), np.float16),
}


@pytest.mark.parametrize("metadata,typed_path", [
    (None, True), ({}, True), ({"format": "pt"}, True), ({"format": "pt", "k": "a:b", "z": "{"}, True),
    ({"format": "pt", "k": "a}b"}, False),  # a "}" in a metadata value: left to the parser
])
def test_library_written_headers_take_the_typed_path(metadata, typed_path):
    data, size = _header_of(save(_ARRAYS, metadata=metadata))
    typed = assert_same(data, size)
    assert (typed is not None) == typed_path
    if typed is None:
        typed = scan_header_unpaused(SHARD, data, size)
    assert typed.tensors == len(_ARRAYS) and typed.data_bytes == sum(a.nbytes for a in _ARRAYS.values())
    tally = typed.groups[("model.layers.{}.mlp.experts.{}.up_proj.weight", 1)]
    assert (tally.tensors, tally.dtypes, tally.shapes_vary, sorted(tally.subs)) == (2, {"U8", "I8"}, True, [0, 1])


@pytest.mark.parametrize("metadata", ['{"format":"pt"}', '{}', '{"k":"a}b","z":"{}"}', '{"k":"v:w"}'])
@pytest.mark.parametrize("spacing", [("", ""), (" ", "\n "), ("\n\t", "\r\n")])
def test_metadata_first_or_last_spaced_out_takes_the_typed_path(metadata, spacing):
    """Writers that build the header with ``json.dumps`` space it out, and those that append
    ``__metadata__`` to a dict put it last: those layouts are typed too (a "}" in a metadata value
    keeps a first metadata on parser.py's path)."""
    space, newline = spacing
    data, size = _header_of(save(_ARRAYS))
    tensors = data.rstrip()[1:-1]
    member = f'"__metadata__"{space}:{space}{metadata}'.encode()
    last = b"{" + tensors + f"{space},{newline}".encode() + member + f"{newline}}}  ".encode()
    first = f"{newline}{{{space}".encode() + member + f"{space},{newline}".encode() + tensors + b"}"
    for moved, typed_path in ((last, True), (first, "}" not in metadata[1:-1])):
        typed = assert_same(moved, size - len(data) + len(moved))
        assert (typed is not None) == typed_path, moved[:80]
        if typed is not None:
            original = scan_header_unpaused(SHARD, data, size)
            assert (typed.groups, typed.tensors, typed.data_bytes, typed.name_hash) == (
                original.groups, original.tensors, original.data_bytes, original.name_hash)


def test_typed_path_refuses_every_library_header_with_one_byte_of_bad_size():
    """Each tensor in turn claims one byte more (the rest shifted): the parser refuses, so must the
    typed path, whichever group (uniform or mixed) the tensor sits in."""
    data, size = _header_of(save(_ARRAYS))
    entries = json.loads(data)
    entries.pop("__metadata__", None)
    for victim in entries:
        position, changed = 0, {}
        for name, info in sorted(entries.items(), key=lambda kv: kv[1]["data_offsets"]):
            span = info["data_offsets"][1] - info["data_offsets"][0] + (name == victim)
            changed[name] = dict(info, data_offsets=[position, position + span])
            position += span
        text = json.dumps(changed, separators=(",", ":"), ensure_ascii=False).encode()
        assert assert_same(text, 8 + len(text) + position) is None, victim


# --- the conformance corpus, its metadata also moved first as the library writes it ---------------

def _metadata_first(header: str | bytes) -> str | bytes | None:
    if not isinstance(header, str):
        return None
    for tail in (',"__metadata__":{"format":"pt"}}', ',"__metadata__":null}', ',"__metadata__":{"k":1}}',
                 ',"__metadata__":[]}', ',"__metadata__":{"k":"a","k":"b"}}', ',"__metadata__":{"k":"\\ud800"}}'):
        if header.endswith(tail) and header.startswith("{"):
            return "{" + tail[1:-1] + "," + header[1:-len(tail)] + "}"
    return None


_CONFORMANCE = [(name, header) for name, header, *_ in CORPUS] + [
    (name + "/metadata-first", _metadata_first(header)) for name, header, *_ in CORPUS if _metadata_first(header)]


@pytest.mark.parametrize("name,header", _CONFORMANCE, ids=[c[0] for c in _CONFORMANCE])
def test_conformance_corpus_same_answer(name, header):
    data = header.encode("utf-8", "surrogatepass") if isinstance(header, str) else header
    for file_size in (None, 8 + len(data) + 10 ** 6):
        assert_same(data, file_size)
    entries = json.loads(data) if name.startswith("valid-real-layout") else None
    if entries is not None:  # the plain valid header takes the typed path, with or without metadata
        end = max(e["data_offsets"][1] for k, e in entries.items() if k != "__metadata__")
        assert _typed(data, 8 + len(data) + end) is not None


# --- generated headers ------------------------------------------------------------------------------

_NAMES = st.sampled_from([
    "a", "b", "model.layers.0.w", "model.layers.1.w", "model.layers.10.w", "model.layers.01.w",
    "layers.3.experts.12.w1", "layers.3.experts.7.w1", "layers.3.experts.7.w2", "x.0", "x.00",
    "__metadata__", "a:b", "a-0", "a,-0", "a [-0", "a}b", "{x}", "é.1", "層.2", "", "a\\u0041", "a\\\\b",
])
_DIM = st.one_of(
    st.integers(0, 4).map(str),
    st.sampled_from(["8", "16", "1099511627776", "4294967296", "18446744073709551615", "18446744073709551616",
                     "100000000000000000000000000000", "-0", "-1", "true", "false", "1.0", "1e2", "null",
                     '"3"', " 2", "-2", "0e0"]),
)
_SHAPE = st.one_of(
    st.lists(_DIM, max_size=10).map(lambda dims: "[" + ",".join(dims) + "]"),
    st.sampled_from(["{}", '"4"', "null", "4", "[[1]]", "[1,]"]),
)
_DTYPE = st.one_of(st.sampled_from(sorted(DTYPE_BITS)).map(json.dumps),
                   st.sampled_from(['"F8_E4M3FN"', '"f32"', "5", "null", '["F32"]']))
_METADATA = st.sampled_from([
    '{"format":"pt"}', "{}", "null", '{"a":"x}y"}', '{"a":"b","a":"c"}', '{"k":"v:w"}', '{"n":{"x":"y"}}',
    '{"n":1}', "[]", '"s"', '{"a":"\\u00e9"}', '{"a":"-0"}', '{"a":"b"} ', '{"a":true}', '{"a":"]"}',
])
_EXTRA = st.sampled_from(['"x":1', '"x":NaN', '"x":[[[]]]', '"x":-0', '"dtype":"F32"', '"shape":[1]',
                          '"data_offsets":[0,0]'])


def _size(dtype_text: str, shape_text: str) -> int | None:
    """The byte size the shape and dtype imply, when both are plain; None when they are not."""
    try:
        dtype, dims = json.loads(dtype_text), json.loads(shape_text)
        numel = 1
        for dim in dims:
            if type(dim) is not int or dim < 0 or dim > 2 ** 20:
                return None
            numel *= dim
        bits = numel * DTYPE_BITS[dtype]
    except (ValueError, TypeError, KeyError):
        return None
    return bits // 8


@st.composite
def _headers(draw) -> tuple[bytes, int | None]:
    colon, comma = draw(st.sampled_from([(":", ","), (":", ","), (": ", ", "), (" :", " ,")]))
    members, position = [], 0
    for _ in range(draw(st.integers(0, 6))):
        dtype, shape = draw(_DTYPE), draw(_SHAPE)
        size = _size(dtype, shape)
        if size is None or draw(st.integers(0, 9)) == 0:
            size = draw(st.integers(0, 64))
        begin = position + draw(st.sampled_from([0] * 12 + [-1, 1, -8]))
        end = begin + size
        offsets = draw(st.sampled_from([f"[{begin},{end}]"] * 8 + [
            f"[{end},{begin}]", f"[{begin},{end},0]", f"[{begin}.0,{end}]", f"[true,{end}]", f"[-0,{end}]",
            f"[{begin}, -0]", f"[{begin},{end + 2 ** 64}]", f"[{begin}]", "null", f"[ {begin} , {end} ]"]))
        fields = [f'"dtype"{colon}{dtype}', f'"shape"{colon}{shape}', f'"data_offsets"{colon}{offsets}']
        change = draw(st.integers(0, 14))
        if change == 0:
            del fields[draw(st.integers(0, 2))]
        elif change == 1:
            fields.insert(draw(st.integers(0, 3)), draw(_EXTRA).replace(":", colon, 1))
        elif change == 2:
            fields = draw(st.permutations(fields))
        entry = "{" + comma.join(fields) + "}" if change != 3 else f"[{dtype},{shape},{offsets}]"
        members.append(f'"{draw(_NAMES)}"{colon}{entry}')
        position = max(position, end)
    place = draw(st.sampled_from(["none", "first", "first", "last", "middle", "twice"]))
    metadata = f'"__metadata__"{colon}{draw(_METADATA)}'
    if place == "first" or place == "twice":
        members.insert(0, metadata)
    if place == "last" or place == "twice":
        members.append(metadata)
    if place == "middle":
        members.insert(len(members) // 2, metadata)
    text = (draw(st.sampled_from(["", " ", "\n"])) + "{" + comma.join(members) + "}"
            + draw(st.sampled_from(["", " ", "   ", "\t\r\n", "\x0b", "\x0c", "\xa0", " x"])))
    data = text.encode()
    file_size = draw(st.sampled_from([None, 8 + len(data) + position, 8 + len(data) + position + 1]))
    return data, file_size


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_headers())
@example((b'{"__metadata__":{"a":"x}y"},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', None))
@example((b'{"__metadata__":{"n":{"x":"y"}},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', None))
@example((b'{"__metadata__":{},"__metadata__":{"dtype":"U8","shape":[],"data_offsets":[0,1]},'
          b'"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', None))
@example((b'{"__metadata__":{"format":"pt"}}', 8 + 32))
@example((b'{"__metadata__":{"format":"pt"},}', None))
@example((b'{"t":{"dtype":"U8","shape":[2,-0],"data_offsets":[0,0]}}', None))
@example((b'{"t":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}', None))
@example((b'{"t":{"dtype":"U8","shape":[18446744073709551616,0],"data_offsets":[0,0]}}', None))
@example((b'{"t":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}', None))
@example((b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,2]},'
          b'"c":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', None))
@example((b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
          None))
@example((b'{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
          None))
@example((b'{"e":{"dtype":"U8","shape":[0],"data_offsets":[1,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
          None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
          b'"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', None))  # metadata shaped as an entry
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"dtype":"U8","shape":[1],'
          b'"data_offsets":[1,2]},"u":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}', None))  # ... in the middle
@example((b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "__metadata__": {"dtype": "U8", "shape": [1], '
          b'"data_offsets": [1, 2]}}', None))  # ... spaced out
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"a":"b"}}x', None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"__metadata__":{"a":"b"}}', None))  # no comma
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"dtype":"U8","shape":[1],'
          b'"data_offsets":[1,2]},"__metadata__":{"a":"b"}}', None))  # a second, entry-shaped metadata
@example((b'{,"__metadata__":{"a":"b"}}', None))  # no tensor before the comma: '{' + '}' alone would pass
@example((b'{ ,"__metadata__":{}}', None))
@example((b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]} ,\n "__metadata__" : {"a": "b"} }', None))
@example((b' { "__metadata__" : {"a": "b"} ,\n"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', None))
@example((b'{"__metadata__":null,"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"a":"b"}}\x0b', None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"a":"b"}}\x0c ', None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"a":"b"}}\xc2\xa0', None))
@example((b'{"__metadata__":{"a":"b"},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\x0b', None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"a":"b"}} } ', None))
@example((b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"a":"b"},"__metadata__":{}}', None))
@example((b'{"x.0.e.0":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]},'
          b'"x.0.e.1":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', None))  # overflow in a mixed group
@example((b'{"t":{"dtype":"U8","shape":[2305843009213693952],"data_offsets":[0,2305843009213693952]}}', None))
def test_generated_headers_same_answer(case):
    assert_same(*case)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["w", "w1", "w_scale", "proj.0"]), st.integers(0, 3), st.integers(0, 12),
                          st.sampled_from(["U8", "BF16", "F4", "F8_E4M3"]), st.lists(st.integers(0, 3), max_size=3)),
                min_size=1, max_size=60),
       st.booleans())
def test_generated_valid_layouts_take_the_typed_path(tensors, metadata):
    """Valid compact headers (the library's layout) of layer x expert groups with mixed dtypes and
    shapes: the typed path takes every one that the parser accepts, and scans it the same."""
    members, position, seen = [], 0, set()
    for stem, layer, expert, dtype, shape in tensors:
        name = f"model.layers.{layer}.experts.{expert}.{stem}"
        if name in seen:
            continue
        seen.add(name)
        numel = 1
        for dim in shape:
            numel *= dim
        size = numel * DTYPE_BITS[dtype] // 8
        members.append(json.dumps(name) + ":" + json.dumps(
            {"dtype": dtype, "shape": shape, "data_offsets": [position, position + size]}, separators=(",", ":")))
        position += size
    if metadata:
        members.insert(0, '"__metadata__":{"format":"pt"}')
    data = ("{" + ",".join(members) + "}").encode()
    typed = assert_same(data, 8 + len(data) + position)
    if not isinstance(_outcome(_exact_scan, data, None), str):
        assert typed is not None


def test_without_msgspec_every_header_takes_the_parser_path():
    """msgspec is a core dependency, but a missing one must cost speed only: same scan, no error."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['msgspec'] = None\n"
        "from ckptinspect.header.typed import decode_plain\n"
        "from ckptinspect.inventory.scan import scan_header_unpaused\n"
        "data = b'{\"a.0.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}'\n"
        "assert decode_plain(data) is None\n"
        "scan = scan_header_unpaused('s', data, None)\n"
        "print(sorted(scan.groups), scan.data_bytes)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[('a.{}.w', 0)] 2"


@pytest.mark.parametrize("later", [
    ["a.05.w", "a.15.w"],  # a leading zero in a member after the first
    ["a.05.w"],  # ... in the only member
    ["a.15.w", "a.05.w", "b.1.w", "b.0.w"],
])
def test_mask_cache_never_answers_for_a_leading_zero(later):
    """A bucket's pattern is kept by mask once a plain bucket showed it (``a.15.w`` -> ``a.{}.w``);
    a later bucket of that mask whose members have a leading zero (``05``: text) must not take it."""
    from tests.test_grouping_differential import assert_agree, header_bytes

    assert_agree(*header_bytes([("a.15.w", "U8", [1]), ("a.25.w", "U8", [1]), ("b.1.w", "U8", [1])]))
    assert_agree(*header_bytes([(name, "U8", [1]) for name in later]))
