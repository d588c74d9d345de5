"""The compiled parser (msgspec) never changes an answer: the header parser's fast path (header/typed.py)
on the whole conformance corpus (tests/test_conformance.py) gives the exact path's result, and
``decode_json`` on hostile JSON (duplicate keys, integers past 64 bits, NaN / Infinity, lone surrogates,
-0, deep nesting) the same result or the same error line as with the standard library's json alone."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_conformance import CORPUS  # noqa: E402

import ckptinspect.json_text as json_text  # noqa: E402
import ckptinspect.header.parser as parser  # noqa: E402
from ckptinspect.errors import CkptInspectError  # noqa: E402

import msgspec  # noqa: E402

# decode_json's compiled decoder (json_text.py).
DECODERS = {"msgspec": msgspec.json.Decoder().decode}


def test_msgspec_is_the_decoder_decode_json_uses():
    assert json_text._compiled_loads.__self__.__class__ is msgspec.json.Decoder


class _Using:
    """decode_json with ``name``'s decoder (None: json alone) while in the block."""

    def __init__(self, name):
        self.new = DECODERS[name] if name else None

    def __enter__(self):
        self.old = json_text._compiled_loads
        json_text._compiled_loads = self.new

    def __exit__(self, *exc):
        json_text._compiled_loads = self.old


def _same(a, b) -> bool:
    """Equal, with NaN equal to NaN, -0.0 told from 0.0, and int told from float (1 vs 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except CkptInspectError as exc:
        return ("error", str(exc))


def _assert_same_outcome(got, want, label=None) -> None:
    """The same outcome: equal values (``_same``) when both decoded, else the same error line."""
    assert got[0] == want[0], label
    assert _same(got[1], want[1]) if got[0] == "ok" else got == want, label


def _header(data: bytes, parse):
    out = _outcome(parse, data, source="x.safetensors")
    if out[0] == "ok":
        h = out[1]
        return ("ok", [h.length, h.names, h.dtypes, h.shapes, h.sizes, h.begins, h.data_bytes, dict(h.metadata)])
    return out


@pytest.mark.parametrize("name,header,data_len,stricter", CORPUS, ids=[c[0] for c in CORPUS])
def test_header_parser_answers_the_same_on_the_fast_and_the_exact_path(name, header, data_len, stricter):
    data = header.encode("utf-8", "surrogatepass") if isinstance(header, str) else header
    _assert_same_outcome(_header(data, parser.parse_header), _header(data, parser.parse_header_exact))


HOSTILE = [
    '{"a": 1, "a": 2}', '{"a": {"b": 1}, "a": [3]}', "[18446744073709551615, 18446744073709551616]",
    "[-9223372036854775808, -9223372036854775809]", "[" + "9" * 30 + "]", "[" + "9" * 5000 + "]",
    "[NaN, Infinity, -Infinity]", "[1e400, -1e400]", '["\\ud800"]', '["\\udfff\\ud800"]', '["\\ud83d\\ude00"]',
    "[-0, -0.0, 0.0]", "[" * 127 + "]" * 127, "[" * 128 + "]" * 128, "[" * 2000 + "]" * 2000,
    '{"weight_map": {"a.weight": "model-00001-of-00002.safetensors"}}', "[1.7976931348623157e308, 5e-324]",
    '"\\u0000"', "[tru]", "{", "", " [1] ", "[1] x", '{"a":1,}', "[01]", '["a\tb"]',
]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("text", HOSTILE)
def test_decode_json_answers_the_same_with_and_without_the_compiled_decoder(text, decoder):
    with _Using(decoder):
        compiled = _outcome(json_text.decode_json, text.encode(), source="f.json")
    without = _reference_decode(text.encode())
    _assert_same_outcome(compiled, without)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(_json)
def test_generated_documents_decode_the_same(value):
    import json

    text = json.dumps(value)
    without = _reference_decode(text)
    for decoder in DECODERS:
        with _Using(decoder):
            compiled = _outcome(json_text.decode_json, text, source="f.json")
        _assert_same_outcome(compiled, without, decoder)


def _reference_decode(data, **kwargs):
    """decode_json's answer with json alone (the compiled decoders switched off)."""
    with _Using(None):
        return _outcome(json_text.decode_json, data, source="f.json", **kwargs)


# Documents where a compiled decoder's answer could differ from json's: a float next to a long digit run (in a
# string, an integer within 64 bits, one past it), integers at the 64-bit edges, floats alone.
FLOAT_AND_DIGITS = [
    '{"a": 1.5, "b": "1234567890123456789012"}', '{"a": 1.5, "b": 18446744073709551615}',
    '{"a": 1.5, "b": 18446744073709551616}', '[0.5, -9223372036854775809]', '[1e5, 12345678901234567890]',
    '{"x": 10000000000000000000}', '{"x": 18446744073709551616}', "18446744073709551616", "1.0",
    '[{"deep": [{"deeper": [2.5, 99999999999999999999]}]}]', '"99999999999999999999"', "[-0.0, 1E2, 3e-7]",
]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("text", FLOAT_AND_DIGITS)
def test_floats_and_long_digit_runs_decode_as_json_does(text, decoder):
    with _Using(decoder):
        compiled = _outcome(json_text.decode_json, text.encode(), source="f.json")
    without = _reference_decode(text.encode())
    assert compiled[0] == without[0] == "ok"
    assert _same(compiled[1], without[1])


# Bytes that may or may not be UTF-8 inside a JSON string: the compiled decoders' UTF-8 checks must
# accept and refuse exactly what Python's decoder does (the document is then decoded by json, which
# words the error).
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=12), st.sampled_from([b'["%s"]', b'{"%s": 1}', b"%s", b'[1, "%s", 2.5]']))
def test_arbitrary_bytes_decode_the_same(raw, frame):
    data = frame.replace(b"%s", raw)
    without = _reference_decode(data)
    for decoder in DECODERS:
        with _Using(decoder):
            compiled = _outcome(json_text.decode_json, data, source="f.json")
        _assert_same_outcome(compiled, without, decoder)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="[]{},:0123456789\" -.e", max_size=40), st.integers(min_value=1, max_value=30))
def test_value_cap_refuses_exactly_what_the_byte_count_bounds(text, cap):
    """The cap's bound is the count of ``,``, ``[``, ``{`` plus one, whatever shortcut computes it."""
    data = text.encode()
    bound = data.count(b",") + data.count(b"[") + data.count(b"{") + 1
    without = _reference_decode(data, max_items=cap)
    for decoder in DECODERS:
        with _Using(decoder):
            compiled = _outcome(json_text.decode_json, data, source="f.json", max_items=cap)
        if bound > cap:
            assert compiled == ("error", f"f.json: would build up to {bound:,} JSON values, over the {cap:,} cap")
        else:
            assert "would build" not in str(compiled[1])
        _assert_same_outcome(compiled, without, decoder)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=10))
def test_header_names_of_arbitrary_bytes_parse_the_same(raw):
    """The header's fast path checks the bytes before trusting the typed decode: msgspec must refuse exactly
    the invalid UTF-8 Python's decoder refuses, and a backslash or ``-0`` in a name must reach the exact path."""
    data = b'{"' + raw + b'":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b-0":{"dtype":"U8","shape":[1],' \
        b'"data_offsets":[2,3]}}'
    _assert_same_outcome(_header(data, parser.parse_header), _header(data, parser.parse_header_exact))


# decode_index_json (json_text.py): the typed decode of an index gives decode_json's answer (json alone as the
# reference), with the members in document order, or hands the document to decode_json.
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEXES = [
    '{"metadata": {"total_size": 10}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", '
    '"b.weight": "model-00002-of-00002.safetensors"}}',
    '{"weight_map": {"a": "model-00001-of-00002.safetensors"}, "metadata": {"total_size": 1.5e3}}',
    '{"weight_map": {"a": "model-00001-of-00002.safetensors"}}', '{"weight_map": {}}', ' \n{ "weight_map" : {} } ',
    '{"metadata": null, "weight_map": {"a": "other.safetensors"}}',  # a shard the listing lacks
    '{"weight_map": {"a": "model-00001-of-00002.safetensors"}, "weight_map": {"b": "x"}}',  # repeated: the last
    '{"metadata": 1, "weight_map": {}, "metadata": 2}', '{"metadata": [1, 2], "weight_map": {"\\u0061": "y"}}',
    '{"weight_map": {"a": 1}}', '{"weight_map": {"a": "s"}, "extra": 1}', '{"weight_map": []}', '{"metadata": {}}',
    '{"\\u0077eight_map": {"a": "s"}}', '{"weight_map": {"a": "\\ud800"}}', '{"weight_map": {"\\udfff": "s"}}',
    '{"metadata": NaN, "weight_map": {}}', '{"metadata": 1e400, "weight_map": {}}',
    '{"metadata": ' + "9" * 5000 + ', "weight_map": {}}', '{"weight_map": {"a": "s"},}', '{"weight_map": {"a": "s"}} x',
    '{"metadata": ' + "[" * 126 + "]" * 126 + ', "weight_map": {}}',  # the document 127 deep: accepted
    '{"metadata": ' + "[" * 127 + "]" * 127 + ', "weight_map": {}}',  # 128 deep: refused
    '{"metadata": ' + "[" * 3000 + "]" * 3000 + ', "weight_map": {}}', "[]", "{}", "",
]


@pytest.mark.parametrize("files", [(), SHARDS, ("config.json", *SHARDS, "sub/other.safetensors")])
@pytest.mark.parametrize("text", INDEXES)
def test_index_documents_decode_as_decode_json_does(text, files):
    data = text.encode()
    got = _outcome(json_text.decode_index_json, data, source="f.json", shard_files=files)
    _assert_same_outcome(got, _reference_decode(data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=12), st.sampled_from([b'{"weight_map": {"%s": "model-00001-of-00002.safetensors"}}',
                                                 b'{"weight_map": {"a": "%s"}}',
                                                 b'{"metadata": "%s", "weight_map": {}}']))
def test_index_documents_of_arbitrary_bytes_decode_the_same(raw, frame):
    data = frame.replace(b"%s", raw)
    got = _outcome(json_text.decode_index_json, data, source="f.json", shard_files=SHARDS)
    _assert_same_outcome(got, _reference_decode(data))


def test_an_index_refused_by_the_value_cap_is_refused_alike():
    data = b'{"weight_map": {' + b",".join(b'"t%d": "s"' % i for i in range(40)) + b"}}"
    got = _outcome(json_text.decode_index_json, data, source="f.json", max_items=30)
    assert got == _reference_decode(data, max_items=30) and got[0] == "error"


def test_listed_shard_names_come_back_as_one_object_each():
    """What makes the typed decode cheaper: a listed shard name is one string object for all its tensors."""
    data = b'{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}}'
    listed = json_text.decode_index_json(data, source="f.json", shard_files=SHARDS)["weight_map"]
    assert listed["a"] is listed["b"]
    unlisted = json_text.decode_index_json(data, source="f.json")["weight_map"]
    assert unlisted == listed and unlisted["a"] is not unlisted["b"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab,[{", max_size=400))
def test_the_value_bound_counts_exactly_as_count_does(text):
    """_value_bound finds rare bytes with find() and counts frequent ones (past 64) with count()."""
    for data in (text, text.encode()):
        for char in (",", "[", "{"):
            needle = char if isinstance(data, str) else char.encode()
            assert json_text._occurrences(data, needle) == data.count(needle)
