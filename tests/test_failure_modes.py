"""MTP failure modes a metadata check can detect (issue 10, "failure modes" (a)-(h)): one real-layout
fixture per mode (fixtures/failure_modes.py), per-engine verdicts at the rules' engine versions and at
the versions where the cited PRs changed the behaviour, and a control that flips each verdict back
(the exporter's or engine's fix), so no expectation holds by accident."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptinspect.pipeline import build_report
from ckptinspect.readiness import assess_mtp, load_rules
from fixtures import generate
from fixtures.failure_modes import exclude_keyed_by_checkpoint_index


def verdicts(mtp) -> tuple[str, str]:
    return mtp.verdicts["sglang"].verdict, mtp.verdicts["vllm"].verdict


def reasons(mtp, engine: str) -> set[str]:
    return set(mtp.verdicts[engine].reasons)


def finding(mtp, code: str, engine: str | None = "any"):
    return next(f for f in mtp.findings if f.code == code and (engine == "any" or f.engine == engine))


def at_version(r, engine: str, version: str):
    rules = load_rules()
    return assess_mtp(r.checkpoint, rules.get(r.mtp.family), rules, engine_versions={engine: version})


def edited_copy(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_every_failure_mode_fixture_is_registered_and_named_as_shipped(fixture_specs):
    from fixtures.failure_modes import failure_mode_fixtures

    names = {s.name for s in failure_mode_fixtures()}
    assert names <= set(fixture_specs) and len(names) == 10
    for spec in failure_mode_fixtures():
        assert spec.mtp_tensors > 0 and spec.notes  # each says which export / report it mirrors


def test_a_plain_linear_shipped_quantized(report):
    """(a) eh_proj caught by compressed-tensors `targets: [Linear]`: both engines build it as a plain
    nn.Linear and cannot load weight_packed / weight_global_scale (vllm-project/vllm PR #47792)."""
    r = report("deepseek_v3_ct_nvfp4_eh_proj_quantized")
    names = {n for g in r.checkpoint.inventory.groups for n in g.names()}
    assert {"model.layers.3.eh_proj.weight_packed", "model.layers.3.eh_proj.weight_global_scale"} <= names
    mtp = r.mtp
    assert verdicts(mtp) == ("unusable", "unusable")
    for engine in ("sglang", "vllm"):
        assert "mtp-plain-linear-quantized" in reasons(mtp, engine)
        assert "model.layers.3.eh_proj" in finding(mtp, "mtp-plain-linear-quantized", engine).message
        # the rest of the MTP layer is built compressed-tensors per module: only eh_proj is the problem
        assert dict(mtp.verdicts[engine].module_quantization)["model.layers.3.eh_proj"] is None
    assert "47792" in finding(mtp, "mtp-plain-linear-quantized", "vllm").reference


def test_b_mtp_scheme_other_than_the_trunk_under_one_algorithm(report):
    """(b) NVFP4 trunk, MXFP4 MTP experts, one ModelOpt quant_algo (vllm-project/vllm#43455)."""
    mtp = report("deepseek_v3_nvfp4_mtp_experts_mxfp4").mtp
    assert mtp.layers[0].schemes.get("mxfp4", 0) > 0
    assert verdicts(mtp) == ("unusable", "unusable")
    assert "mtp-scheme-differs-from-trunk" in reasons(mtp, "vllm")
    msg = finding(mtp, "mtp-scheme-differs-from-trunk", "vllm").message
    assert "mxfp4; trunk nvfp4" in msg and "model.layers.3.mlp.experts" in msg
    # SGLang never gets that far: its DeepSeek NextN is built unquantized under modelopt_fp4
    assert reasons(mtp, "sglang") == {"mtp-quantized-but-built-unquantized"}
    # the same layout with NVFP4 MTP experts is only the 4-bit-draft warning
    same_scheme = report("deepseek_v3_nvfp4_mtp_fp4").mtp
    assert "mtp-scheme-differs-from-trunk" not in reasons(same_scheme, "vllm")


def test_c_glm_fp8_shared_head_scales_by_vllm_version(report):
    """(c) zai-org GLM-4.x-FP8: the MTP shared_head.head ships FP8 + weight_scale. vLLM < #31757: KeyError;
    #31757 without #32101: real MTP scales dropped (~1% acceptance); with both: fine."""
    r = report("glm4_moe_fp8_mtp_head_quantized")
    assert "model.layers.2.shared_head.head.weight_scale" in {n for g in r.checkpoint.inventory.groups for n in g.names()}
    assert verdicts(r.mtp) == ("ready", "ready")  # SGLang skips shared_head.head; vLLM 0.33 has #32101
    info = {f.code: f.severity for f in r.mtp.findings if f.engine == "vllm"}
    assert info == {"glm-mtp-head-scale-keyerror": "info", "glm-mtp-fp8-scales-dropped": "info"}
    expected = {"0.13.0": ("unusable", {"glm-mtp-head-scale-keyerror"}),
                "0.14.1": ("unusable", {"glm-mtp-fp8-scales-dropped"}), "0.15.0": ("ready", set())}
    for version, (verdict, why) in expected.items():
        vl = at_version(r, "vllm", version).verdicts["vllm"]
        assert (vl.verdict, set(vl.reasons)) == (verdict, why), version
    msg = finding(at_version(r, "vllm", "0.13.0"), "glm-mtp-head-scale-keyerror", "vllm").message
    assert "model.layers.2.shared_head.head" in msg and "KeyError" in msg


def test_d_mixed_precision_mtp_experts_in_another_algorithm(report, make_fixture, tmp_path):
    """(d) MIXED_PRECISION quantized_layers: trunk experts NVFP4, MTP experts FP8_BLOCK_SCALES, for which
    vLLM's mixed config had no routed-expert method (vllm-project/vllm#55496); 0.32 / 0.33 build them with
    Fp8MoEMethod (rules/quant/vllm.yaml, checked against vLLM's own class by tests/test_draft_quant_vllm.py)."""
    r = report("qwen3_5_moe_mixed_mtp_experts_fp8_block")
    mtp = r.mtp
    # SGLang 0.5.23's ModelOptMixedPrecisionConfig builds every module from its own quantized_layers entry
    # ("One config serves Linear and FusedMoE", SG:layers/quantization/modelopt_quant.py:934-936), so the
    # per-module table shows the draft as stored and no stored-only rule makes it unusable.
    assert verdicts(mtp) == ("ready", "ready") and not reasons(mtp, "vllm") and not reasons(mtp, "sglang")
    experts = next(m for m in mtp.modules if m.module == "mtp.layers.0.mlp.experts.{}.gate_proj")
    assert experts.built["vllm"] != "unquantized" and "FP8_BLOCK_SCALES" in experts.causes["vllm"]
    assert all(row.matches["sglang"] for row in mtp.modules)
    old = at_version(r, "vllm", "0.31.0")
    assert old.verdicts["vllm"].verdict == "unusable"
    assert reasons(old, "vllm") == {"mtp-mixed-precision-moe-algo-unsupported"}
    assert "FP8_BLOCK_SCALES" in finding(old, "mtp-mixed-precision-moe-algo-unsupported", "vllm").message
    check = finding(mtp, "mtp-layer-algo-differs", None)
    assert check.severity == "warning" and "trunk NVFP4" in check.message
    # control: the MTP experts listed as FP8 (per-tensor), a routed-expert method vLLM has

    def fp8(cfg):
        q = cfg["quantization_config"]["quantized_layers"]
        for key in q:
            if key.startswith("mtp."):
                q[key] = {"quant_algo": "FP8"}

    src = make_fixture("qwen3_5_moe_mixed_mtp_experts_fp8_block")
    dst = edited_copy(src, tmp_path / "mixed_fp8", fp8)
    hq = json.loads((dst / "hf_quant_config.json").read_text())
    hq["quantization"]["quantized_layers"] = json.loads((dst / "config.json").read_text())[
        "quantization_config"]["quantized_layers"]
    (dst / "hf_quant_config.json").write_text(json.dumps(hq))
    fixed_report = build_report(str(dst), progress=False)
    fixed = fixed_report.mtp
    assert "mtp-mixed-precision-moe-algo-unsupported" not in reasons(at_version(fixed_report, "vllm", "0.31.0"), "vllm")
    assert "FP8 (trunk NVFP4)" in finding(fixed, "mtp-layer-algo-differs", None).message


def test_e_nvfp4_global_scales_missing(report):
    """(e) NVFP4 MTP experts built NVFP4 by vLLM but without weight_scale_2 (vllm-project/vllm PR #54444)."""
    r = report("qwen3_5_moe_mtp_nvfp4_no_global_scale")
    names = {n for g in r.checkpoint.inventory.groups for n in g.names()}
    assert "mtp.layers.0.mlp.experts.0.gate_proj.weight_scale" in names
    assert "mtp.layers.0.mlp.experts.0.gate_proj.weight_scale_2" not in names
    mtp = r.mtp
    assert verdicts(mtp) == ("unusable", "unusable")
    assert "mtp-nvfp4-global-scale-missing" in reasons(mtp, "vllm")
    assert "mtp.layers.0.mlp.experts.{}.gate_proj" in finding(mtp, "mtp-nvfp4-global-scale-missing").message
    # the same export with its global scales is only the 4-bit warning for vLLM
    with_scales = report("qwen3_5_moe_mtp_partial_quant").mtp
    assert "mtp-nvfp4-global-scale-missing" not in reasons(with_scales, "vllm")
    assert with_scales.verdicts["vllm"].verdict == "degraded"


def test_e_weight_only_nvfp4_is_not_a_missing_scale(report, make_fixture, tmp_path):
    """(e) NVFP4A16 (input_activations: null) legitimately has no input_global_scale; the same tensors
    under a W4A4 declaration are missing their activation scales."""
    mtp = report("qwen3_5_moe_ct_nvfp4a16_mtp_experts").mtp
    assert mtp.verdicts["vllm"].verdict == "degraded" and reasons(mtp, "vllm") == {"mtp-quantized-4bit"}

    def w4a4(cfg):
        group = cfg["quantization_config"]["config_groups"]["group_0"]
        group["input_activations"] = {**group["weights"], "dynamic": "local"}

    dst = edited_copy(make_fixture("qwen3_5_moe_ct_nvfp4a16_mtp_experts"), tmp_path / "w4a4", w4a4)
    declared_w4a4 = build_report(str(dst), progress=False).mtp
    assert declared_w4a4.verdicts["vllm"].verdict == "unusable"
    assert "mtp-nvfp4-input-scale-missing" in reasons(declared_w4a4, "vllm")


def test_f_official_gptq_int4_with_bf16_mtp(report):
    """(f) Qwen3.5 GPTQ-Int4 with a BF16 MTP opted out by dynamic `-:.*mtp.*`: vLLM >= PR #48816 builds
    it unquantized (ready, not a false unusable); older vLLM built the draft MoE with GPTQ and failed."""
    r = report("qwen3_5_moe_gptq_int4_bf16_mtp")
    mtp = r.mtp
    # SGLang 0.5.23 runs the export as gptq_marlin, whose fused MoE ignores `dynamic`
    # (SG:layers/quantization/gptq/gptq.py GPTQMarlinConfig.get_quant_method; its own class says so in
    # tests/test_draft_quant_sglang.py): the BF16 MTP experts get GPTQ parameters. The other MTP
    # modules are Linears, which `-:.*mtp.*` does leave unquantized.
    assert verdicts(mtp) == ("unusable", "ready")
    assert reasons(mtp, "sglang") == {"mtp-bf16-not-excluded"}
    assert "fused MoE is built quantized whatever `dynamic` says" in finding(mtp, "mtp-bf16-not-excluded", "sglang").message
    sg = dict(mtp.verdicts["sglang"].module_quantization)
    assert sg["mtp.layers.0.mlp.experts.{}.gate_proj"] == "gptq" and sg["mtp.layers.0.self_attn.q_proj"] is None
    for engine in ("vllm",):
        v = mtp.verdicts[engine]
        assert v.draft_quantization is None and all(b is None for _, b in v.module_quantization)
    old = at_version(r, "vllm", "0.23.1").verdicts["vllm"]
    # the old fused-MoE build is data (rules/quant/vllm.yaml gptq "<0.24"): the table shows the BF16 MTP
    # experts built GPTQ, and both the generic and the family defect name it
    assert old.verdict == "unusable" and set(old.reasons) == {"mtp-gptq-draft-inherits-quant", "mtp-bf16-not-excluded"}
    assert finding(mtp, "mtp-gptq-draft-inherits-quant", "vllm").severity == "info"  # other versions: info


def test_f_gptq_without_the_mtp_opt_out_is_unusable(make_fixture, tmp_path):
    """Control for (f): the same export without the `-:.*mtp.*` rule makes every engine build GPTQ
    parameters for the BF16 MTP (a true unusable)."""
    def no_opt_out(cfg):
        cfg["quantization_config"]["dynamic"].pop("-:.*mtp.*")

    dst = edited_copy(make_fixture("qwen3_5_moe_gptq_int4_bf16_mtp"), tmp_path / "gptq_no_mtp_rule", no_opt_out)
    mtp = build_report(str(dst), progress=False).mtp
    assert verdicts(mtp) == ("unusable", "unusable")
    assert "mtp-bf16-not-excluded" in reasons(mtp, "vllm") and "mtp-bf16-not-excluded" in reasons(mtp, "sglang")


def test_g_exclude_keyed_by_another_layer_index(report, tmp_path):
    """(g) BF16 MTP ignored as model.layers.{L}.*: SGLang's NextN mapper re-keys only model.layers.61
    (sgl-project/sglang PR #34906), vLLM matches checkpoint names. At index 61 SGLang is fine."""
    mtp = report("deepseek_v3_ct_fp8_mtp_ignored_at_3").mtp
    assert verdicts(mtp) == ("unusable", "ready")
    assert reasons(mtp, "sglang") == {"exclude-keyed-by-checkpoint-name"}
    msg = finding(mtp, "exclude-keyed-by-checkpoint-name", "sglang").message
    assert "model.layers.3.*" in msg and "model.layers.3.mlp.experts.{}.down_proj" in msg
    # what each engine builds: SGLang FP8 parameters for the BF16 experts, vLLM nothing quantized
    sg, vl = mtp.verdicts["sglang"], mtp.verdicts["vllm"]
    assert sg.draft_quantization == "compressed-tensors" and vl.draft_quantization is None
    assert dict(sg.module_quantization)["model.layers.3.mlp.experts.{}.down_proj"] == "compressed-tensors"
    spec = exclude_keyed_by_checkpoint_index(61)
    generate.FIXTURES[spec.name] = spec
    try:
        at_61 = build_report(str(generate.build_fixture(spec.name, tmp_path)), progress=False).mtp
    finally:
        del generate.FIXTURES[spec.name]
    assert at_61.layers[0].prefix == "model.layers.61."
    assert verdicts(at_61) == ("ready", "ready")


def test_h_per_projection_ignore_entries_miss_sglang_fused_names(report, make_fixture, tmp_path):
    """(h) ignore names q_proj / k_proj / v_proj ... one by one; SGLang's Qwen3.5 MTP asks about qkv_proj /
    gate_up_proj. Versions whose MTP class had no packed_modules_mapping skipped the BF16 tensors
    (sgl-project/sglang#35797); 0.5.23 expands the fused names, so both engines are ready, as with a regex."""
    mtp = report("qwen3_5_moe_ct_nvfp4_mtp_ignored_per_projection").mtp
    # SGLang 0.5.23's Qwen3_5ForCausalLMMTP exposes packed_modules_mapping (SG:models/qwen3_5_mtp.py), so
    # should_ignore_layer expands qkv_proj / gate_up_proj to the listed shards: the per-projection entries
    # cover the fused modules there (tests/test_draft_quant_sglang.py asks SGLang's own class).
    assert verdicts(mtp) == ("ready", "ready")
    row = next(m for m in mtp.modules if m.module == "mtp.layers.0.self_attn.q_proj")
    assert row.built["sglang"] == "unquantized" and "mtp.layers.0.self_attn.q_proj" in row.causes["sglang"]
    built = dict(mtp.verdicts["sglang"].module_quantization)
    assert built["mtp.layers.0.self_attn.q_proj"] is None and built["mtp.layers.0.self_attn.o_proj"] is None
    assert mtp.verdicts["vllm"].draft_quantization is None

    def regex(cfg):
        q = cfg["quantization_config"]
        q["ignore"] = [e for e in q["ignore"] if not e.startswith("mtp.")] + ["re:mtp.*"]

    fixed = build_report(str(edited_copy(make_fixture("qwen3_5_moe_ct_nvfp4_mtp_ignored_per_projection"),
                                         tmp_path / "regex", regex)), progress=False).mtp
    assert verdicts(fixed) == ("ready", "ready")
