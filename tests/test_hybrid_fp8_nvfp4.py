"""Hybrid FP8 + NVFP4 DeepSeek-V4 checkpoints (quant_method fp8 + quant_algo MIXED_PRECISION + moe_quant_algo
NVFP4 + group_size, the nvidia/DeepSeek-V4-Pro-NVFP4 style) whose MTP experts keep the source MXFP4.

SGLang 0.5.23 detects the layout (SG:configs/model_config.py nvfp4_moe_meta) and wraps Fp8Config in
HybridFp8NvFp4Config, whose NVFP4 exclude list adds model.decoder.* / stages.*, so the MTP's fused MoE
is built MXFP4. rules/families/deepseek_v4.yaml says so; the oracle asks SGLang's own class."""

from __future__ import annotations

import pytest

from ckptinspect.pipeline import build_report
from fixtures.hybrid_nvfp4 import HYBRID_KEYS
from toy_inputs import copy_with_config


def _reasons(mtp, engine):
    return set(mtp.verdicts[engine].reasons)


def test_mxfp4_mtp_experts_are_what_sglang_builds(report):
    r = report("deepseek_v4_hybrid_nvfp4")
    stored = {g.scheme for g in r.checkpoint.inventory.groups if g.component == "routed_expert"
              and g.mtp_layer is not None}
    trunk = {g.scheme for g in r.checkpoint.inventory.groups if g.component == "routed_expert" and g.mtp_layer is None}
    assert (stored, trunk) == ({"mxfp4"}, {"nvfp4"})
    assert r.mtp.verdicts["sglang"].verdict == "ready"
    assert not [f for f in r.mtp.findings if f.engine == "sglang" and f.severity == "error"]


def test_nvfp4_mtp_experts_do_not_fit_sglangs_hybrid_path(report):
    mtp = report("deepseek_v4_hybrid_nvfp4_mtp_nvfp4").mtp
    assert mtp.verdicts["sglang"].verdict == "unusable"
    assert "mtp-hybrid-nvfp4-mtp-experts-not-mxfp4" in _reasons(mtp, "sglang")


@pytest.mark.parametrize("drop", ["moe_quant_algo", "group_size"])
def test_without_every_hybrid_key_one_fp8_config_builds_the_mtp(make_fixture, tmp_path, drop):
    """nvfp4_moe_meta needs quant_algo MIXED_PRECISION, moe_quant_algo NVFP4 and group_size: without one,
    SGLang builds every fused MoE from the Fp8Config and MXFP4 MTP experts next to NVFP4 trunk experts
    are the mismatch the generic rule reports."""
    def edit(cfg):
        del cfg["quantization_config"][drop]

    d = copy_with_config(make_fixture("deepseek_v4_hybrid_nvfp4"), tmp_path / drop, edit)
    mtp = build_report(str(d), progress=False).mtp
    assert "mtp-scheme-differs-from-trunk" in _reasons(mtp, "sglang")


def test_sglang_builds_mtp_moe_mxfp4_and_trunk_moe_nvfp4():
    """SGLang's own HybridFp8NvFp4Config.get_quant_method, per fused MoE: the NextN (model.decoder.*) and
    DSpark (stages.*) MoEs take the MXFP4 method, trunk MoEs NVFP4 unless the ignore list names them, in
    which case they fall back too; Linears keep the FP8 dispatch."""
    from tests.sglang_quant_oracle import ask_sglang

    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "scale_fmt": "ue8m0",
          "weight_block_size": [128, 128], **HYBRID_KEYS}
    modules = [["model.decoder.mlp.experts", "moe"], ["stages.0.mlp.experts", "moe"],
               ["model.layers.1.mlp.experts", "moe"], ["model.layers.2.mlp.experts", "moe"],
               ["model.decoder.self_attn.wq_a", "linear"]]
    cases = [{"method": "fp8", "config": qc, "modules": modules,
              "hybrid_nvfp4": {"group_size": 16, "exclude_modules": ignore, "is_fp4_experts": fp4}}
             for ignore, fp4 in (([], True), (["model.layers.2.*"], True), ([], False))]
    plain, ignored, fp8_experts = ask_sglang(cases)
    assert plain["model.decoder.mlp.experts"] == plain["stages.0.mlp.experts"] == "Mxfp4FlashinferTrtllmMoEMethod"
    assert plain["model.layers.1.mlp.experts"] == plain["model.layers.2.mlp.experts"] == "ModelOptNvFp4FusedMoEMethod"
    assert plain["model.decoder.self_attn.wq_a"] == "Fp8LinearMethod"
    assert ignored["model.layers.2.mlp.experts"] == "Mxfp4FlashinferTrtllmMoEMethod"
    assert ignored["model.layers.1.mlp.experts"] == "ModelOptNvFp4FusedMoEMethod"
    # without V4's FP4 experts the excluded MoEs take Fp8Config's own MoE method
    assert fp8_experts["model.decoder.mlp.experts"] == "Fp8MoEMethod"


# --- nvidia's released layout: the four ignore globs, hf_quant_config.json with the same list ---------------

def test_nvidia_release_layout_is_ready_on_both_engines_with_no_contradiction(report):
    """Attention / shared experts FP8 block, trunk experts NVFP4, MTP experts MXFP4, `ignore` naming
    *.attn.*, *.ffn.shared_experts.*, head, mtp.*. Both engines build every module as stored: FP8 configs
    read no `ignore` for Linears (rules/quant/*.yaml fp8), SGLang's hybrid NVFP4 exclude list and vLLM
    0.33's ModelOpt ignore keep the MTP experts MXFP4. No error, and the per-module table answers for
    every MTP module on both engines."""
    r = report("deepseek_v4_nvidia_nvfp4")
    errors = [f for f in (*r.checkpoint.findings, *r.mtp.findings) if f.severity == "error"]
    assert errors == []
    assert {e: v.verdict for e, v in r.mtp.verdicts.items()} == {"sglang": "ready", "vllm": "ready"}
    not_read = [f for f in r.checkpoint.findings if f.code == "excluded-entry-not-read"]
    assert len(not_read) == 1 and "22 module pattern(s)" in not_read[0].message
    rows = r.mtp.modules
    assert rows and all(row.built.get(e) not in (None, "", "no draft model") and row.matches[e]
                        for row in rows for e in ("sglang", "vllm"))
    assert {row.module for row in rows} >= {"mtp.0.attn.wq_a", "mtp.0.e_proj", "mtp.0.ffn.experts.{}.w1"}
    assert not [f for f in r.checkpoint.findings if f.code == "fp8-ignore-not-read"]


def test_nvidia_layout_without_mtp_in_ignore_is_unusable_on_vllm(make_fixture, tmp_path):
    """Not vacuous: without "mtp.*" in `ignore`, vLLM 0.33 builds the MXFP4 MTP experts NVFP4
    (VL:models/deepseek_v41/quant_config.py _is_nvfp4_expert_layer) while SGLang still adds model.decoder.*
    to its NVFP4 exclude list itself."""
    def edit(cfg):
        cfg["quantization_config"]["ignore"] = [e for e in cfg["quantization_config"]["ignore"] if e != "mtp.*"]

    d = copy_with_config(make_fixture("deepseek_v4_nvidia_nvfp4"), tmp_path / "no_mtp_ignore", edit)
    mtp = build_report(str(d), progress=False).mtp
    assert mtp.verdicts["vllm"].verdict == "unusable"
    assert "mtp-hybrid-mxfp4-experts-built-nvfp4" in _reasons(mtp, "vllm")
    assert mtp.verdicts["sglang"].verdict == "ready"


def test_sglang_builds_the_nvidia_release_as_stored():
    """SGLang's own HybridFp8NvFp4Config with the release's ignore list: the NextN MoE MXFP4, trunk MoEs
    NVFP4, the attention Linears of trunk and NextN FP8 (Fp8Config reads no `ignore`)."""
    from tests.sglang_quant_oracle import ask_sglang
    from fixtures.hybrid_nvfp4 import NVIDIA_IGNORE

    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "scale_fmt": "ue8m0",
          "weight_block_size": [128, 128], **HYBRID_KEYS, "ignore": NVIDIA_IGNORE}
    modules = [["model.decoder.mlp.experts", "moe"], ["model.layers.1.mlp.experts", "moe"],
               ["model.decoder.self_attn.wq_a", "linear"], ["model.layers.1.self_attn.wq_a", "linear"],
               ["model.decoder.mlp.shared_experts.w1", "linear"]]
    (answer,) = ask_sglang([{"method": "fp8", "config": qc, "modules": modules,
                             "hybrid_nvfp4": {"group_size": 16, "exclude_modules": NVIDIA_IGNORE, "is_fp4_experts": True}}])
    assert answer["model.decoder.mlp.experts"] == "Mxfp4FlashinferTrtllmMoEMethod"
    assert answer["model.layers.1.mlp.experts"] == "ModelOptNvFp4FusedMoEMethod"
    assert {answer[m] for m in ("model.decoder.self_attn.wq_a", "model.layers.1.self_attn.wq_a",
                                "model.decoder.mlp.shared_experts.w1")} == {"Fp8LinearMethod"}
