"""2026 MTP families, part A: DeepSeek-V4 / V4.1, GLM-5.x Flash, GLM-OCR, Kimi-K3, Qwen4-Exp, Intern-S2.

Per-engine verdicts on the tiny real-layout fixtures, the mechanisms DeepSeek-V4 needed (bare ``.scale``
companions, block FP8 with ``.scale``, packed FP4 experts in I8 + E8M0, ``ffn.experts.E.w1`` counting),
checked against the generator's own tensor list and against an independent public inventory of the
full-scale DeepSeek-V4-Flash layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ckptinspect.inventory.classify import COMPANION_ROLES, component_of, split_role
from ckptinspect.pipeline import build_report
from ckptinspect.quant.detect import Part, detect_scheme
from fixtures.families_2026_a import families_2026_a_fixtures
from toy_inputs import copy_with_config

# fixture -> (SGLang 0.5.23, vLLM 0.33.0)
EXPECTED = {
    "deepseek_v4_flash": ("ready", "ready"),
    "deepseek_v4_flash_base": ("ready", "ready"),
    "deepseek_v4_flash_nomtp": ("unusable", "unusable"),
    "deepseek_v4_flash_mtp_incomplete": ("unusable", "unusable"),
    "deepseek_v4_flash_dspark": ("ready", "ready"),  # SGLang DSPARK / vLLM dspark
    "deepseek_v41_dspark": ("ready", "ready"),
    "deepseek_v41": ("unusable", "unusable"),  # no dspark_* keys: neither engine's DSpark draft can be built
    "deepseek_v4_flash_nvfp4": ("degraded", "degraded"),
    "glm5_flash": ("ready", "ready"),
    "glm5_flash_nvfp4_mtp_fp4": ("unusable", "degraded"),
    "glm_ocr": ("ready", "ready"),
    "kimi_k3": ("unusable", "ready"),  # no SGLang Kimi-K3 NextN class found
    "qwen4_exp": ("ready", "ready"),
    "intern_s2_preview": ("ready", "ready"),
    "interns2_mobius": ("ready", "ready"),  # SGLang 0.5.23 maps Mobius to Qwen3_5ForCausalLMMTP
}


def reasons(mtp, engine: str) -> set[str]:
    return set(mtp.verdicts[engine].reasons)




def test_every_fixture_of_this_module_has_an_expectation():
    assert {s.name for s in families_2026_a_fixtures()} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdict_table(report, fixture_specs, name):
    r = report(name)
    assert (r.mtp.verdicts["sglang"].verdict, r.mtp.verdicts["vllm"].verdict) == EXPECTED[name]
    assert r.checkpoint.family == r.mtp.family == fixture_specs[name].family
    # a verdict never milder than an error about the same engine's MTP tensors
    for engine, verdict in r.mtp.verdicts.items():
        errors = [f for f in r.mtp.findings if f.engine == engine and f.severity == "error"]
        if errors:
            assert verdict.verdict == "unusable", (engine, [f.code for f in errors])


# --- DeepSeek-V4: schemes, roles and counts against the generator's tensor list ----------------

def test_deepseek_v4_inventory_matches_the_generated_layout(report, fixture_specs):
    spec = fixture_specs["deepseek_v4_flash"]
    inv = report("deepseek_v4_flash").checkpoint.inventory
    assert inv.totals.tensors == spec.expected_tensors and inv.totals.bytes == spec.expected_bytes
    assert inv.totals.params == spec.expected_params  # FP4 experts count two logical values per I8 byte
    by_name = {t.name: t for t in spec.tensors}
    for g in inv.groups:
        if g.pattern.endswith(".scale") and not g.pattern.endswith("_scale"):
            assert g.role == "scale" and g.params == 0, g.pattern
        if ".ffn.experts." in g.pattern:
            assert g.scheme == "mxfp4" and g.component in ("routed_expert", "mtp"), g.pattern
        if g.role == "weight" and g.dtypes == ("F8_E4M3",):
            assert g.scheme == "fp8_block", g.pattern  # never per-tensor: the .scale holds 128x128 tiles
    # no tensor of the layout is left without a known scheme except the hash-routing table (I64)
    others = {g.pattern for g in inv.groups if g.scheme == "other"}
    assert others and all(p.endswith("ffn.gate.tid2eid") for p in others)
    assert all(name in by_name for name in ("embed.weight", "head.weight", "mtp.0.e_proj.scale"))


def test_deepseek_v4_flash_base_experts_are_block_fp8(report, fixture_specs):
    inv = report("deepseek_v4_flash_base").checkpoint.inventory
    experts = [g for g in inv.groups if ".ffn.experts." in g.pattern]
    assert experts and {g.scheme for g in experts} == {"fp8_block"}
    assert {g.dtypes for g in experts if g.role == "scale"} == {("F32",)}
    assert inv.totals.params == fixture_specs["deepseek_v4_flash_base"].expected_params


def test_deepseek_v4_components(report):
    groups = report("deepseek_v4_flash").checkpoint.inventory.groups
    comp = {g.pattern: g.component for g in groups}
    assert comp["embed.weight"] == "embedding" and comp["head.weight"] == "lm_head"
    assert comp["layers.{}.ffn.gate.weight"] == "router" and comp["layers.{}.ffn.gate.bias"] == "router"
    assert comp["layers.{}.ffn.gate.tid2eid"] == "router"
    assert comp["layers.{}.ffn.experts.{}.w1.weight"] == "routed_expert"
    assert comp["mtp.{}.e_proj.weight"] == comp["mtp.{}.h_proj.weight"] == "mtp_fusion"
    assert all(g.mtp_layer == 0 for g in groups if g.pattern.startswith("mtp."))


def test_deepseek_v4_experts_counted_per_projection(report, make_fixture, tmp_path):
    r = report("deepseek_v4_flash")
    experts = r.checkpoint.config.routed_experts
    per_layer = [g for g in r.checkpoint.inventory.groups
                 if g.kind == "per_expert" and g.mtp_layer is None and g.role == "weight"]
    # w1, w2 and w3 are separate groups, each holding every expert of its layer
    assert {g.pattern for g in per_layer} == {f"layers.{{}}.ffn.experts.{{}}.{w}.weight" for w in ("w1", "w2", "w3")}
    assert all(g.experts == experts for g in per_layer)
    assert r.mtp.layers[0].experts_present == r.mtp.layers[0].experts_expected == experts


def test_missing_bare_scale_is_a_companion_count_error(make_fixture, tmp_path):
    dst = tmp_path / "v4_one_scale_short"
    shutil.copytree(make_fixture("deepseek_v4_flash"), dst)
    _drop_tensor(dst, "layers.1.ffn.experts.2.w3.scale")
    r = build_report(str(dst), progress=False)
    hits = [f for f in r.checkpoint.findings if f.code == "quant-companion-count-mismatch"]
    assert [f.subject for f in hits] == ["layers.1.ffn.experts.N.w3"] and hits[0].severity == "error"
    assert "4 weights but 3 'scale' tensors" in hits[0].message


def test_v4_mtp_layer_missing_fusion_is_named(report):
    mtp = report("deepseek_v4_flash_mtp_incomplete").mtp
    for engine in ("sglang", "vllm"):
        assert "mtp-missing-tensors" in reasons(mtp, engine)
    assert set(mtp.layers[0].missing) == {"e_proj", "h_proj"}  # relative to the layer prefix mtp.0.


def test_declared_v4_mtp_dropped_by_export(report):
    mtp = report("deepseek_v4_flash_nomtp").mtp
    assert mtp.present_layers == 0 and mtp.declared_layers == 1
    msg = next(f.message for f in mtp.findings if f.code == "mtp-declared-but-absent" and f.engine == "vllm")
    assert "ValueError" in msg


def test_v41_stages_without_dspark_keys_are_no_ready_draft(report):
    mtp = report("deepseek_v41").mtp
    assert mtp.present_layers == 3
    assert "engine-has-no-draft-model" in reasons(mtp, "vllm")
    assert mtp.verdicts["vllm"].draft_architecture is None
    # the stages hold dspark_n_routed_experts experts, not the trunk's n_routed_experts
    assert [(x.experts_present, x.experts_expected) for x in mtp.layers] == [(2, 2)] * 3
    # no draft is built: nothing is said about how one would be quantized or which layers it reuses
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
        assert reasons(mtp, engine) == {"mtp-missing-tensors", "engine-has-no-draft-model"}


@pytest.mark.parametrize("name, family, vllm_arch", [
    ("deepseek_v4_flash_dspark", "deepseek_v4_dspark", "DSparkDraftModel"),
    ("deepseek_v41_dspark", "deepseek_v41_dspark", "DSparkV41DraftModel")])
def test_dspark_release_is_a_ready_dspark_draft(report, name, family, vllm_arch):
    """SG:configs/model_config.py _config_draft_model loads DeepseekV4ForCausalLMDSpark when
    checkpoint_bundles_dspark_draft (any dspark_* key) holds; vLLM's method dspark reads the same stages."""
    r = report(name)
    mtp = r.mtp
    assert r.checkpoint.family == family and mtp.present_layers == 3
    sg, vl = mtp.verdicts["sglang"], mtp.verdicts["vllm"]
    assert (sg.method, sg.draft_architecture) == ("DSPARK", "DeepseekV4ForCausalLMDSpark")
    assert (vl.method, vl.draft_architecture) == ("dspark", vllm_arch)
    assert not [f for f in mtp.findings if f.severity == "error"]


def test_dspark_match_needs_a_dspark_key(report, make_fixture, tmp_path):
    """The same checkpoint without its dspark_* keys is read as a V4 NextN release and fails there, as SGLang's
    NextN loader would (checkpoint_bundles_dspark_draft false -> DeepseekV4ForCausalLMNextN)."""
    def drop(cfg):
        for key in [k for k in cfg if k.startswith("dspark_")]:
            del cfg[key]

    mtp_dir = copy_with_config(make_fixture("deepseek_v4_flash_dspark"), tmp_path / "d", drop)
    r = build_report(str(mtp_dir), progress=False)
    assert r.checkpoint.family == "deepseek_v4"
    for engine in ("sglang", "vllm"):
        assert r.mtp.verdicts[engine].verdict == "unusable"
        assert "mtp-missing-tensors" in reasons(r.mtp, engine)

    def only_noise(cfg):  # one key is enough (SG: any of the four)
        drop(cfg)
        cfg["dspark_noise_token_id"] = 127

    r = build_report(str(copy_with_config(make_fixture("deepseek_v4_flash_dspark"), tmp_path / "n", only_noise)),
                     progress=False)
    assert r.checkpoint.family == "deepseek_v4_dspark"

    def null_keys(cfg):  # SG checks "is not None": null keys do not count
        for key in [k for k in cfg if k.startswith("dspark_")]:
            cfg[key] = None

    r = build_report(str(copy_with_config(make_fixture("deepseek_v4_flash_dspark"), tmp_path / "z", null_keys)),
                     progress=False)
    assert r.checkpoint.family == "deepseek_v4"


def test_dspark_stage_missing_a_layer_tensor_is_an_error(make_fixture, tmp_path):
    src = make_fixture("deepseek_v4_flash_dspark")
    dst = tmp_path / "x"
    shutil.copytree(src, dst)
    _drop_tensor(dst, "mtp.1.attn.wkv.weight")
    _drop_tensor(dst, "mtp.1.attn.wkv.scale")
    mtp = build_report(str(dst), progress=False).mtp
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
        assert "mtp-missing-tensors" in reasons(mtp, engine)


def test_requantized_v4_mtp_is_degraded_but_native_mxfp4_is_not(report):
    native, requant = report("deepseek_v4_flash").mtp, report("deepseek_v4_flash_nvfp4").mtp
    assert "mxfp4" in native.schemes and "nvfp4" not in native.schemes
    assert "nvfp4" in requant.schemes
    for engine in ("sglang", "vllm"):
        assert "mtp-quantized-4bit" in reasons(requant, engine)
        assert "mtp-quantized-4bit" not in reasons(native, engine)


# --- detector and classifier mechanisms -------------------------------------------------------

def _parts(**parts: tuple[str, tuple[int, ...]]) -> dict[str, Part]:
    out = {}
    for key, (dtype, shape) in parts.items():
        suffix = "." + key
        role = split_role("m" + suffix)[2]
        out[suffix] = Part(role, suffix, dtype, shape, 1)
    return out


@settings(max_examples=60, deadline=None)
@given(out=st.integers(1, 64).map(lambda n: n * 16), inp=st.integers(1, 64).map(lambda n: n * 32),
       group=st.sampled_from([16, 32, 64]))
def test_i8_weight_with_e8m0_scale_is_mxfp4_only_at_32_values_per_scale(out, inp, group):
    # stored I8 [out, inp/2]; the scale has one entry per `group` logical values
    parts = _parts(weight=("I8", (out, inp // 2)), scale=("F8_E8M0", (out, inp // group)))
    assert detect_scheme(parts) == ("mxfp4" if group == 32 else "int8")
    # grouped 3-D storage [E, out, in/2] follows the same rule; a float scale is never an E8M0 exponent
    grouped = _parts(weight=("I8", (4, out, inp // 2)), scale=("F8_E8M0", (4, out, inp // group)))
    assert detect_scheme(grouped) == ("mxfp4" if group == 32 else "int8")
    assert detect_scheme(_parts(weight=("I8", (out, inp // 2)), scale=("F32", (out, inp // 32)))) == "int8"


@settings(max_examples=60, deadline=None)
@given(out=st.integers(1, 2048), inp=st.integers(1, 2048))
def test_fp8_with_bare_scale_granularity(out, inp):
    block = _parts(weight=("F8_E4M3", (out, inp)), scale=("F8_E8M0", (-(-out // 128), -(-inp // 128))))
    expect = "fp8_tensor" if out <= 128 and inp <= 128 else "fp8_block"
    assert detect_scheme(block) == expect
    channel = _parts(weight=("F8_E4M3", (out, inp)), scale=("F32", (out, 1)))
    assert detect_scheme(channel) == ("fp8_tensor" if out == 1 else "fp8_channel")


def test_bare_scale_is_a_companion_role():
    assert split_role("layers.{}.attn.wq_a.scale") == ("layers.{}.attn.wq_a", ".scale", "scale")
    assert "scale" in COMPANION_ROLES
    # underscore-joined parameters are not companions: hyper-connection mixes are real parameters
    assert split_role("layers.{}.hc_attn_scale")[2] == "other"
    assert split_role("mtp.{}.hc_head_scale")[2] == "other"


@pytest.mark.parametrize("module,component", [
    ("mtp.{}.e_proj", "mtp_fusion"), ("mtp.{}.h_proj", "mtp_fusion"), ("mtp.fc_embedding", "mtp_fusion"),
    ("mtp.fc_hidden", "mtp_fusion"), ("embed", "embedding"), ("head", "lm_head"),
    ("layers.{}.ffn.gate", "router"), ("layers.{}.ffn.shared_experts.w1", "shared_expert"),
    ("layers.{}.attn.wkv", "attention"), ("model.visual.merger.head", "vision"),
])
def test_2026_component_names(module, component):
    assert component_of(module) == component


# --- other families ---------------------------------------------------------------------------

def test_glm5_flash_mtp_under_language_model(report):
    r = report("glm5_flash")
    L = r.checkpoint.config.num_hidden_layers
    assert r.mtp.declared_key == "text_config.num_nextn_predict_layers"
    assert r.mtp.layers[0].prefix == f"model.language_model.layers.{L}."
    assert r.mtp.verdicts["sglang"].draft_architecture == "Glm5NextForConditionalGenerationNextN"


def test_glm5_flash_nvfp4_mtp_built_unquantized_by_sglang(report):
    mtp = report("glm5_flash_nvfp4_mtp_fp4").mtp
    assert mtp.verdicts["sglang"].draft_quantization is None  # built unquantized
    assert "mtp-quantized-but-built-unquantized" in reasons(mtp, "sglang")
    assert reasons(mtp, "vllm") == {"mtp-quantized-4bit"}


def test_kimi_k3_nested_text_config(report, make_fixture, tmp_path):
    r = report("kimi_k3")
    assert r.mtp.declared_key == "text_config.num_nextn_predict_layers"
    assert r.mtp.layers[0].prefix.startswith("language_model.model.layers.")
    assert r.mtp.layers[0].experts_present == r.mtp.layers[0].experts_expected == 4

    def depth_two(cfg):
        cfg["text_config"]["num_nextn_predict_layers"] = 2

    mtp = build_report(str(copy_with_config(make_fixture("kimi_k3"), tmp_path / "k3", depth_two)), progress=False).mtp
    assert mtp.verdicts["vllm"].verdict == "unusable" and "mtp-depth-exceeds-tensors" in reasons(mtp, "vllm")


def test_qwen4_exp_split_fusion_is_required(report, make_fixture, tmp_path):
    assert report("qwen4_exp").mtp.complete
    src = make_fixture("qwen4_exp")
    dst = tmp_path / "no_fc_hidden"
    shutil.copytree(src, dst)
    _drop_tensor(dst, "mtp.fc_hidden.weight")
    mtp = build_report(str(dst), progress=False).mtp
    assert mtp.layers[0].missing == ("fc_hidden",)
    assert {v.verdict for v in mtp.verdicts.values()} == {"unusable"}


def test_interns2_mobius_counts_mtp_experts_from_mtp_num_experts(report, make_fixture, tmp_path):
    layer = report("interns2_mobius").mtp.layers[0]
    assert layer.experts_present == layer.experts_expected == 2

    def drop_key(cfg):
        del cfg["text_config"]["mtp_num_experts"]

    mtp = build_report(str(copy_with_config(make_fixture("interns2_mobius"), tmp_path / "m", drop_key)), progress=False).mtp
    # without the key the trunk's expert count applies and the MTP block looks short
    assert mtp.layers[0].experts_expected == 4 and "mtp-missing-experts" in reasons(mtp, "vllm")


def test_rules_list_shows_the_new_families(cli):
    out = cli("rules", "list").stdout
    for fid, arch in (("deepseek_v4", "DeepseekV4ForCausalLM"), ("deepseek_v41", "DeepseekV41ForCausalLM"),
                      ("glm5_next", "Glm5NextForConditionalGeneration"), ("glm_ocr", "GlmOcrForConditionalGeneration"),
                      ("kimi_k3", "KimiK3ForConditionalGeneration"), ("qwen4_exp", "Qwen4ExpForConditionalGeneration"),
                      ("intern_s2", "InternS2PreviewForConditionalGeneration"),
                      ("interns2_mobius", "InternS2MobiusForConditionalGeneration")):
        line = next((ln for ln in out.splitlines() if ln.split()[:1] == [fid]), None)
        assert line is not None and arch in line, fid


def _drop_tensor(directory: Path, name: str) -> None:
    """Rewrite the shard holding ``name`` without it (header and data) and drop it from the index."""
    import struct

    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = directory / index["weight_map"].pop(name)
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    start, end = header.pop(name)["data_offsets"]
    index["metadata"]["total_size"] -= end - start
    out_header, chunks, offset = {}, [], 0
    for key, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        start, end = info["data_offsets"]
        chunks.append(data[start:end])
        out_header[key] = {**info, "data_offsets": [offset, offset + end - start]}
        offset += end - start
    if meta is not None:
        out_header["__metadata__"] = meta
    blob = json.dumps(out_header).encode()
    shard.write_bytes(struct.pack("<Q", len(blob)) + blob + b"".join(chunks))
    index_path.write_text(json.dumps(index))
