"""The dry-load request on the wire (verify/request.py): the columnar form the engine's Python decodes must
give exactly the rows the row form gives (name, dtype, shape, is_mtp, in order), for every fixture family
and for hostile names (braces, leading zeros, huge indices) where the one-``re.sub`` pattern falls back to
``_shape_of``; the engine side's decoder (engine_side/_dryload_common.py) reads it the same, with msgspec
and with json. The full-scale 397B differential (the same VerifyResult before and after) is
benchmarks/bench_verify_paired.py's (BENCHMARKS.md, verify)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE_SIDE = ROOT / "ckptinspect" / "verify" / "engine_side"


def _engine_common():
    sys.path.insert(0, str(ENGINE_SIDE))
    try:
        spec = importlib.util.spec_from_file_location("_dryload_common_under_test", ENGINE_SIDE / "_dryload_common.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ENGINE_SIDE))


def _rows_both_ways(raw, templates, layers):
    from ckptinspect.inventory.mtp_prefix import compile_prefixes
    from ckptinspect.verify.request import build_request, encode_request, request_rows, tensor_rows

    prefixes = compile_prefixes(tuple(templates), layers)
    reference = [(name, dtype, list(shape), flag) for name, dtype, shape, flag in tensor_rows(raw, prefixes, layers)]
    request = build_request(raw, prefixes, layers)
    columnar = [(name, dtype, list(shape), flag) for name, dtype, shape, flag in request_rows(request)]
    common = _engine_common()
    decoded = json.loads(encode_request(request))
    engine = [(name, dtype, list(shape), flag) for name, dtype, shape, flag in common.request_rows(decoded)]
    return reference, columnar, engine


@pytest.mark.parametrize("name", ["qwen3_5_moe_nvfp4", "deepseek_v3_fp8", "qwen3_5_moe_ct_nvfp4a16_mtp_experts"])
def test_columnar_request_gives_the_rows_of_the_row_form(name, tmp_path):
    from ckptinspect.config.normalize import normalize_config
    from ckptinspect.readiness import GENERIC_MTP_PREFIXES, load_rules
    from ckptinspect.sources import open_source
    from fixtures.generate import build_fixture

    raw = open_source(str(build_fixture(name, tmp_path)), progress=False)
    config = normalize_config(raw.json_files["config.json"], source="config.json")
    family = load_rules(()).match(config)
    templates = family.mtp_prefixes if family is not None else GENERIC_MTP_PREFIXES
    reference, columnar, engine = _rows_both_ways(raw, templates, config.num_hidden_layers)
    assert any(flag for *_, flag in reference)  # the MTP flags are part of what is compared
    assert columnar == reference and engine == reference


def _header(names_shapes) -> bytes:
    doc, offset = {}, 0
    for name, dtype, shape in names_shapes:
        size = 1 if dtype == "F8_E4M3" else 2
        for n in shape:
            size *= n
        doc[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return json.dumps(doc).encode()


def test_hostile_names_take_the_reference_pattern():
    from ckptinspect.records import RawCheckpoint

    names = [("model.layers.{L}.x.weight", "BF16", [2, 2]), ("model.layers.4.{k}.0.weight", "BF16", [2]),
             ("model.layers.04.mlp.weight", "BF16", [2]),
             ("model.layers.4.mlp.experts.12345678901234567890.w", "BF16", [1]),
             ("mtp.layers.0.mlp.weight", "F8_E4M3", [4, 2]), ("model.layers.4.mlp.weight", "BF16", [2, 2]),
             ("model.layers.3.mlp.weight", "BF16", [2, 2]), ("lm_head.weight", "BF16", [2, 2]), ("x.1", "BF16", [1])]
    raw = RawCheckpoint(ref="t", kind="local", location="t", files=("a.safetensors",), json_files={},
                        headers={"a.safetensors": _header(names)}, file_sizes={"a.safetensors": None})
    reference, columnar, engine = _rows_both_ways(raw, ("model.layers.{L+k}.", "mtp.layers.{k}."), 4)
    assert [flag for *_, flag in reference] == [False, True, False, True, True, True, False, False, False]
    assert columnar == reference and engine == reference


def test_engine_side_reads_the_request_with_msgspec_or_json(monkeypatch):
    import io

    common = _engine_common()
    payload = {"tensor_names": ["a", "b"], "tensor_kinds": [["BF16", [2, 3], False]], "tensor_kind": [0, 0],
               "json_files": {"config.json": {"x": 1.5}}}
    data = json.dumps(payload).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    with_msgspec = common.read_request()
    monkeypatch.setitem(sys.modules, "msgspec", None)  # an engine environment without msgspec
    monkeypatch.setitem(sys.modules, "msgspec.json", None)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert common.read_request() == with_msgspec == payload
    # the old row form is still read as given
    assert common.request_rows({"tensors": [["a", "BF16", [1], True]]}) == [["a", "BF16", [1], True]]


def test_request_keeps_the_config_infinity_the_engine_reads(monkeypatch):
    """A released config's non-finite float (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8 ``time_step_limit:
    [0.0, Infinity]``) reaches the engine as written: msgspec alone writes it as null, which the engine's
    config class refuses. The engine side's reader gives it back as inf."""
    import io
    import math

    from ckptinspect.verify.request import encode_request

    request = {"json_files": {"config.json": {"time_step_limit": [0.0, math.inf]}}, "tensor_names": ["a"]}
    common = _engine_common()
    stdin = io.TextIOWrapper(io.BytesIO(encode_request(request)))
    monkeypatch.setattr("sys.stdin", stdin)
    decoded = common.read_request()
    assert decoded["json_files"]["config.json"]["time_step_limit"] == [0.0, math.inf]
    assert decoded["tensor_names"] == ["a"]
    batch = {"jobs": [{"json_files": {}}, request]}  # verify_many's form
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(encode_request(batch))))
    assert common.read_request()["jobs"][1]["json_files"]["config.json"]["time_step_limit"][1] == math.inf
    finite = {"json_files": {"config.json": {"time_step_limit": [0.0, 0.1]}}}
    assert json.loads(encode_request(finite)) == finite


def test_non_gated_fused_experts_expect_w1_alone():
    """SGLang's FusedMoE built with is_gated=False (Nemotron-H's relu2 experts: up_proj only) loads w1 alone into
    w13_weight (0.5.23 layers/moe/fused_moe_triton/layer.py:804-808): the slot check expects no w3 there."""
    import types

    import torch

    common = _engine_common()
    # A real module tree, so an unresolved name fails as torch's own get_submodule fails (AttributeError).
    model = torch.nn.Module()
    for layer, is_gated in (("a", True), ("b", False)):
        experts = torch.nn.Module()
        experts.moe_runner_config = types.SimpleNamespace(is_gated=is_gated)
        holder = torch.nn.Module()
        holder.experts = experts
        setattr(model, layer, holder)
    assert common.shard_names("a.experts.w13_weight", common._gated_experts(model, "a.experts.w13_weight")) == ("w1", "w3")
    assert common.shard_names("b.experts.w13_weight", common._gated_experts(model, "b.experts.w13_weight")) == ("w1",)
    assert common._gated_experts(model, "c.experts.w13_weight") is True  # not resolved: gated
    assert common.shard_names("b.experts.w2_weight", False) == ("w2",)
