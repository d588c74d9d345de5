"""The pure safetensors header parser: every validation rule, exact sizes for packed dtypes."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save

from ckptinspect.errors import HeaderError
from ckptinspect.header.parser import DTYPE_BITS, parse_header, read_length_prefix


def _split(blob: bytes) -> tuple[bytes, int]:
    (n,) = struct.unpack("<Q", blob[:8])
    return blob[8:8 + n], len(blob)


def _header(entries: dict, data_len: int | None = None) -> tuple[bytes, int]:
    raw = json.dumps(entries).encode()
    end = max((e["data_offsets"][1] for k, e in entries.items() if k != "__metadata__"), default=0)
    size = 8 + len(raw) + (end if data_len is None else data_len)
    return raw, size


def test_matches_the_reference_writer():
    """Headers written by the real safetensors library parse to the same names, shapes and sizes."""
    tensors = {"a.weight": np.zeros((3, 5), np.float32), "b": np.zeros((7,), np.int8),
               "scalar": np.zeros((), np.float64), "empty": np.zeros((0, 4), np.float16)}
    header, size = _split(save(tensors, metadata={"format": "pt"}))
    parsed = parse_header(header, source="x.safetensors", file_size=size)
    assert set(parsed.names) == set(tensors)
    by_name = dict(zip(parsed.names, zip(parsed.sizes, parsed.numels)))
    for name, array in tensors.items():
        assert by_name[name] == (array.nbytes, array.size)
    assert parsed.metadata == {"format": "pt"}
    assert parsed.data_bytes == sum(a.nbytes for a in tensors.values())


def test_metadata_is_optional_and_padding_is_allowed():
    raw, size = _header({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})
    padded = raw + b" " * 5
    parsed = parse_header(padded, source="x", file_size=size + 5)
    assert parsed.metadata == {} and parsed.names == ["w"]


@pytest.mark.parametrize("dtype,shape,nbytes", [
    ("F4", [6, 4], 12),          # 4-bit: 24 elements in 12 bytes
    ("F6_E2M3", [4, 4], 12),     # 6-bit: 16 elements in 12 bytes
    ("F8_E8M0", [3, 5], 15),
    ("U8", [7168, 9216], 7168 * 9216),  # packed NVFP4 stays a U8 byte count
])
def test_sub_byte_and_packed_sizes_are_exact(dtype, shape, nbytes):
    raw, size = _header({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}})
    parsed = parse_header(raw, source="x", file_size=size)
    assert parsed.sizes == [nbytes]


def test_every_safetensors_dtype_is_known():
    expected = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
                "F16", "BF16", "I32", "U32", "F32", "I64", "U64", "F64", "C64", "F4", "F6_E2M3", "F6_E3M2"}
    assert expected <= set(DTYPE_BITS)


@pytest.mark.parametrize("entries,message", [
    ({"t": {"dtype": "Q3", "shape": [2], "data_offsets": [0, 2]}}, "unknown dtype 'Q3'"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "is 8 bytes but data_offsets span 4"),
    ({"t": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, "bytes but data_offsets span"),
    ({"t": {"dtype": "F32", "shape": [2, "x"], "data_offsets": [0, 8]}}, "not a list of non-negative integers"),
    ({"t": {"dtype": "F32", "shape": [-2, -1], "data_offsets": [0, 8]}}, "not a list of non-negative integers"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, "0 <= begin <= end"),
    ({"t": {"dtype": "F32", "shape": [2]}}, "missing 'data_offsets'"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "overlaps the previous tensor"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}, "leaves a hole"),
    ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"k": 1}},
     "__metadata__ must map strings to strings"),
    # Each of these slips past one column check if another is missing (parser._columns).
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 16]}}, "is not \\[begin, end\\]"),
    ({"t": {"dtype": "U8", "shape": [1], "data_offsets": [False, True]}}, "is not \\[begin, end\\]"),
    ({"t": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, "not a list of non-negative integers"),
    ({"t": {"dtype": "U8", "shape": "ab", "data_offsets": [0, 2]}}, "not a list of non-negative integers"),
    ({"t": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, "unknown dtype"),
    ({"t": [1, 2]}, "entry is not an object"),
    ({"ok": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
      "t": {"dtype": "U8", "shape": [2, -2, -1], "data_offsets": [2, 6]}}, "not a list of non-negative integers"),
])
def test_invalid_entries_are_rejected_with_the_reason(entries, message):
    raw = json.dumps(entries).encode()
    with pytest.raises(HeaderError, match=message) as info:
        parse_header(raw, source="shard.safetensors")
    assert str(info.value).startswith("shard.safetensors: ")


def test_duplicate_names_are_detected_despite_json_keeping_the_last():
    raw = (b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},'
           b' "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}')
    with pytest.raises(HeaderError, match="duplicate tensor name 't'"):
        parse_header(raw, source="x")


def test_a_name_containing_data_offsets_is_not_mistaken_for_a_duplicate():
    raw, size = _header({'odd."data_offsets"': {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})
    assert parse_header(raw, source="x", file_size=size).names == ['odd."data_offsets"']


@pytest.mark.parametrize("delta", [-1, 3])
def test_data_buffer_must_end_at_the_file_end(delta):
    raw, size = _header({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})
    with pytest.raises(HeaderError, match="truncated or trailing data"):
        parse_header(raw, source="x", file_size=size + delta)


@pytest.mark.parametrize("data,message", [
    (b"\xff\xfe{}", "not valid UTF-8"),
    (b'{"t": ', "not valid JSON"),
    (b"[1, 2]", "not an object"),
])
def test_malformed_json(data, message):
    with pytest.raises(HeaderError, match=message):
        parse_header(data, source="x")


def test_length_prefix_bounds():
    assert read_length_prefix(struct.pack("<Q", 10), source="x", file_size=18) == 10
    with pytest.raises(HeaderError, match="shorter than the 8-byte"):
        read_length_prefix(b"\x01\x02", source="x")
    with pytest.raises(HeaderError, match="runs past the end"):
        read_length_prefix(struct.pack("<Q", 100), source="x", file_size=50)
    with pytest.raises(HeaderError, match="exceeds the cap"):
        read_length_prefix(struct.pack("<Q", 200_000_000), source="x")
    with pytest.raises(HeaderError, match="too small"):
        read_length_prefix(struct.pack("<Q", 1), source="x")
