"""The GGUF header parser against ggml's own reader (``gguf.GGUFReader``), and hostile headers.

Differential: files written by the ``gguf`` writer (every ggml type, every value type, nested arrays,
big-endian, a split set) are parsed by both; metadata, value types, tensor names, shapes, types,
offsets and byte sizes must agree. Hostile: byte-level mutations of a valid header must give one
HeaderError naming the file (never another exception, never a hang), with the read bounded.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ckptinspect.errors import HeaderError
from ckptinspect.header.gguf import MAX_KEPT_ARRAY, ByteWindow, GgufArray, parse_gguf
from ckptinspect.header.gguf_types import GGML_TYPES
from fixtures.gguf_models import MODELS, build, write_gguf

gguf = pytest.importorskip("gguf")


def _parse(path: Path):
    data = path.read_bytes()
    return parse_gguf(ByteWindow(data, source=str(path), file_size=len(data)))


def _reference_value(field):
    types = [gguf.GGUFValueType(t) for t in field.types]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if types[0] != gguf.GGUFValueType.ARRAY:
        return field.parts[field.data[0]].tolist()[0]
    if len(types) > 1 and types[1] == gguf.GGUFValueType.ARRAY:
        return ("nested", tuple(v for i in field.data for v in field.parts[i].tolist()))  # leaves, flattened
    if len(types) > 1 and types[1] == gguf.GGUFValueType.STRING:
        return tuple(bytes(field.parts[i]).decode("utf-8") for i in field.data)
    return tuple(v for i in field.data for v in field.parts[i].tolist())


def assert_same_as_reference(path: Path) -> None:
    ours = _parse(path)
    ref = gguf.GGUFReader(path)
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(ref_fields)
    for key, field in ref_fields.items():
        value, expected = ours.metadata[key], _reference_value(field)
        kind = gguf.GGUFValueType(field.types[0]).name
        if kind == "ARRAY":
            item = gguf.GGUFValueType(field.types[1]).name if len(field.types) > 1 else "?"
            assert ours.value_types[key] == f"ARRAY[{item}]", key
            if isinstance(value, GgufArray):
                assert value.count == len(field.data) and value.item_type == item, key
                continue
            if expected and expected[0] == "nested":
                assert tuple(v for inner in value for v in inner) == expected[1], key
                continue
        else:
            assert ours.value_types[key] == kind, key
        if isinstance(expected, float) or (isinstance(expected, tuple) and expected and isinstance(expected[0], float)):
            assert value == pytest.approx(expected, rel=1e-6), key
        else:
            assert value == expected, key
    assert len(ours.tensors) == len(ref.tensors)
    for mine, theirs in zip(ours.tensors, ref.tensors):
        assert mine.name == theirs.name
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == theirs.tensor_type.name
        assert ours.header_bytes + mine.offset == theirs.data_offset
        assert mine.nbytes == theirs.n_bytes
        assert mine.elements == theirs.n_elements
    assert ours.alignment == ref.alignment
    assert ours.header_bytes == ref.data_offset


def test_every_ggml_type_matches_the_reference_table():
    assert {t.name: (t.block_size, t.type_size) for t in GGML_TYPES.values()} == \
        {t.name: gguf.GGML_QUANT_SIZES[t] for t in gguf.GGMLQuantizationType}
    assert {t.id: t.name for t in GGML_TYPES.values()} == {int(t): t.name for t in gguf.GGMLQuantizationType}


@pytest.mark.parametrize("big_endian", [False, True])
def test_every_ggml_type_and_value_type_agree_with_the_reference(tmp_path, big_endian):
    V = gguf.GGUFValueType
    kv = {
        "general.name": ("str", "every-type"), "t.u8": ("u8", 200), "t.i8": ("i8", -5), "t.u16": ("u16", 60000),
        "t.i16": ("i16", -300), "t.u32": ("u32", 4_000_000_000), "t.i32": ("i32", -7), "t.f32": ("f32", 0.25),
        "t.bool": ("bool", False), "t.u64": ("u64", 2**63 + 5), "t.i64": ("i64", -(2**40)), "t.f64": ("f64", 1.5e300),
        "t.strs": ("strs", ["a", "ü", ""]), "t.i32s": ("i32s", [1, -2, 3]), "t.f32s": ("f32s", [0.5, 2.0]),
        "t.nested": ("raw", ([[1, 2], [3]], V.ARRAY, V.ARRAY)),
        "t.long": ("raw", (list(range(MAX_KEPT_ARRAY + 3)), V.ARRAY, V.UINT16)),
        "t.longstrs": ("strs", [str(i) for i in range(MAX_KEPT_ARRAY + 1)]),
    }
    tensors = [(f"t.{t.name}", (2, 512), t.name) for t in GGML_TYPES.values() if 512 % t.block_size == 0]
    assert len(tensors) == len(GGML_TYPES)
    path = tmp_path / "every.gguf"
    write_gguf(path, "llama", kv, tensors, big_endian=big_endian)
    assert_same_as_reference(path)
    header = _parse(path)
    assert header.big_endian is big_endian
    assert isinstance(header.metadata["t.long"], GgufArray) and header.metadata["t.long"].count == MAX_KEPT_ARRAY + 3
    assert header.metadata["t.nested"] == ((1, 2), (3,))


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    return build(tmp_path_factory.mktemp("gguf"))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fixture_models_agree_with_the_reference(gguf_models, name):
    for path in gguf_models[name]:
        assert_same_as_reference(path)


def test_split_set_has_split_keys_and_every_tensor_once(gguf_models):
    files = gguf_models["GLM-4.5-Air-Q8_0"]
    assert [f.name[-20:] for f in files] == [f"-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    headers = [_parse(f) for f in files]
    assert [h.metadata["split.no"] for h in headers] == [0, 1, 2]
    assert {h.metadata["split.count"] for h in headers} == {3}
    names = [t.name for h in headers for t in h.tensors]
    assert len(names) == len(set(names)) == headers[0].metadata["split.tensors.count"]


# -- hostile headers ------------------------------------------------------------------------------

def _header(kv: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv + tensors


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv_u32(key: str, value: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, value)


def _nested(depth: int) -> bytes:
    body = struct.pack("<IQ", 4, 0)
    for _ in range(depth - 1):
        body = struct.pack("<IQ", 9, 1) + body
    return _s("deep") + struct.pack("<I", 9) + body


def _tensor(name: str, dims: tuple[int, ...], ggml: int, offset: int) -> bytes:
    return _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ggml, offset)


HOSTILE = {
    "empty": (b"", "truncated"),
    "not-gguf": (b"PK\x03\x04" + b"\0" * 40, "not a GGUF file"),
    "version-1": (_header(b"", 0, version=1), "unsupported GGUF version 1"),
    "version-99": (_header(b"", 0, version=99), "unsupported GGUF version 99"),
    "huge-tensor-count": (_header(b"", 0, n_tensors=2**63), "over the"),
    "huge-kv-count": (_header(b"", 2**40), "over the"),
    "kv-count-past-file": (_header(_kv_u32("a", 1), 50), "truncated"),
    "key-length-past-file": (_header(struct.pack("<Q", 1000) + b"abc", 1), "truncated"),
    "key-length-huge": (_header(struct.pack("<Q", 2**62), 1), "over the"),
    "string-value-past-file": (_header(_s("k") + struct.pack("<IQ", 8, 10**7) + b"x", 1), "truncated"),
    "string-value-huge": (_header(_s("k") + struct.pack("<IQ", 8, 2**60), 1), "over the"),
    "unknown-value-type": (_header(_s("k") + struct.pack("<I", 13) + b"\0" * 8, 1), "unknown value type 13"),
    "unknown-array-item": (_header(_s("k") + struct.pack("<IIQ", 9, 77, 1), 1), "unknown item type 77"),
    "array-count-huge": (_header(_s("k") + struct.pack("<IIQ", 9, 10, 2**61), 1), "claims"),
    "string-array-count-huge": (_header(_s("k") + struct.pack("<IIQ", 9, 8, 2**40), 1), "claims"),
    "deep-arrays": (_header(_nested(50), 1), "deeper than"),
    "invalid-utf8-key": (_header(_s(b"\xff\xfe") + struct.pack("<II", 4, 1), 1), "not valid UTF-8"),
    "duplicate-key": (_header(_kv_u32("a", 1) + _kv_u32("a", 2), 2), "appears twice"),
    "bad-alignment": (_header(_kv_u32("general.alignment", 24), 1), "power-of-two"),
    "unknown-ggml-type": (_header(b"", 0, _tensor("w", (32,), 4, 0), 1), "unknown ggml type 4"),
    "five-dims": (_header(b"", 0, _tensor("w", (1, 1, 1, 1, 1), 0, 0), 1), "dimensions"),
    "zero-dims": (_header(b"", 0, _s("w") + struct.pack("<I", 0), 1), "dimensions"),
    "shape-overflow": (_header(b"", 0, _tensor("w", (2**32, 2**32), 0, 0), 1), "overflows"),
    "row-not-block-multiple": (_header(b"", 0, _tensor("w", (100,), 12, 0), 1), "not a multiple"),
    "misaligned-offset": (_header(b"", 0, _tensor("w", (8,), 0, 3), 1), "alignment"),
    "overlapping-tensors": (_header(b"", 0, _tensor("a", (64,), 0, 0) + _tensor("b", (64,), 0, 32), 2),
                            "overlaps"),
    "duplicate-tensor": (_header(b"", 0, _tensor("a", (8,), 0, 0) + _tensor("a", (8,), 0, 32), 2), "twice"),
    "data-past-file": (_header(b"", 0, _tensor("w", (1024,), 0, 0), 1), "past the end"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_is_one_header_error_naming_the_file(tmp_path, case):
    data, needle = HOSTILE[case]
    with pytest.raises(HeaderError) as err:
        parse_gguf(ByteWindow(data, source="bad.gguf", file_size=len(data)))
    message = str(err.value)
    assert message.startswith("bad.gguf: ") and "\n" not in message
    assert needle in message


def test_truncation_at_every_byte_of_a_real_header_is_a_header_error(gguf_models):
    data = gguf_models["GLM-4.5-Air-Q4_K_M"][0].read_bytes()
    header_end = _parse(gguf_models["GLM-4.5-Air-Q4_K_M"][0]).header_bytes
    for cut in range(0, header_end, 97):
        with pytest.raises(HeaderError):
            parse_gguf(ByteWindow(data[:cut], source="cut.gguf", file_size=cut))


def test_extending_window_reads_only_what_the_header_needs(gguf_models):
    """A window that starts with 16 bytes and extends on demand reads the header and little more."""
    data = gguf_models["GLM-4.5-Air-Q4_K_M"][0].read_bytes()
    calls: list[tuple[int, int]] = []

    def extend(start: int, stop: int) -> bytes:
        calls.append((start, stop))
        return data[start:stop]

    header = parse_gguf(ByteWindow(data[:16], source="x.gguf", file_size=len(data), extend=extend))
    assert header == _parse(gguf_models["GLM-4.5-Air-Q4_K_M"][0])
    fetched = 16 + sum(b - a for a, b in calls)
    assert header.header_bytes - header.alignment <= fetched <= header.header_bytes * 1.25 + 16384
    assert all(a == b for (_, a), (b, _) in zip(calls, calls[1:]))  # each read extends from the current end


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "small.gguf"
    kv = {"general.name": ("str", "fuzz"), "llama.block_count": ("u32", 1), "t.strs": ("strs", ["a", "bc"]),
          "t.i32s": ("i32s", [1, 2, 3])}
    write_gguf(path, "llama", kv, [("blk.0.attn_q.weight", (2, 256), "Q4_K"), ("output_norm.weight", (8,), "F32")])
    return path.read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.integers(0, 800)))
def test_mutated_headers_parse_or_raise_header_error_only(small_gguf, edits, cut):
    data = bytearray(small_gguf)
    for pos, value in edits:
        if pos < len(data):
            data[pos] = value
    if cut is not None:
        data = data[:cut]
    try:
        header = parse_gguf(ByteWindow(bytes(data), source="fuzz.gguf", file_size=len(data)))
    except HeaderError as err:
        assert str(err).startswith("fuzz.gguf: ") and "\n" not in str(err)
    else:
        assert header.header_bytes <= len(data) + header.alignment and all(t.nbytes >= 0 for t in header.tensors)


def test_nested_short_arrays_are_kept_only_within_a_budget(tmp_path):
    """4,000 arrays of 4,000 items each would build 16M Python ints: past the header's budget they are summarized."""
    from ckptinspect.header.gguf import MAX_KEPT_ITEMS

    inner = struct.pack("<IQ", 0, 4000) + bytes(4000)
    body = struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 9, 4000) + inner * 4000
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body
    header = parse_gguf(ByteWindow(data, source="n.gguf", file_size=len(data)))
    value = header.metadata["k"]
    assert len(value) == 4000
    kept = sum(len(v) for v in value if isinstance(v, tuple))
    assert kept <= MAX_KEPT_ITEMS and any(isinstance(v, GgufArray) and v.count == 4000 for v in value)
