"""Issue 20 §3 / issue 26 §2: the plan says what each engine's own `auto` picks, and the rules for it
are SGLang 0.5.23's code, obtained by calling that code.

SGLang's auto resolution runs here on CPU in a subprocess (the `--no-deps` install of
tests/sglang_parser.py, with the import stand-ins of tests/sglang_memory.py): `initialize_fp4_gemm_config`
and `initialize_fp8_gemm_config` (SG:layers/quantization/fp4_utils.py, fp8_utils.py),
`_moe_runner_backend_quant_constraints` and `_speculative_moe_runner_default` (SG:arg_groups/overrides.py),
each under SGLang's own `override_platform` for one compute capability. The rule files are compared
with what that code returns, not with themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptinspect.plan import make_plan
from ckptinspect.plan.backends import env_for
from ckptinspect.plan.rules import PlanFacts, engine_rules, first_match
from sglang_memory import _CELL, REAL_CONFIGS, STUBBED
from sglang_parser import ensure_sglang

CAPS = {"sm80": (8, 0), "sm86": (8, 6), "sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0), "sm103": (10, 3),
        "sm110": (11, 0), "sm120": (12, 0), "sm121": (12, 1)}

_AUTO = r'''
import types
from sglang.srt.runtime_context import override_platform
import sglang.srt.layers.quantization.fp4_utils as f4
import sglang.srt.layers.quantization.fp8_utils as f8
import sglang.srt.arg_groups.overrides as ov
caps = json.loads(sys.argv[3])

def facts(cap):
    major = cap[0]
    return dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_sm90=major == 9, is_sm100=major == 10,
                is_sm110=major == 11, is_sm120=major == 12, is_blackwell=major in (10, 11, 12),
                device_capability=tuple(cap), device_sm=major * 10 + cap[1])

out = {}
for arch, cap in caps.items():
    with override_platform(**facts(cap)):
        ex = types.SimpleNamespace(kernel=types.SimpleNamespace(fp4_gemm_runner_backend="auto",
                                                                fp8_gemm_runner_backend="auto"))
        f4.get_exec = f8.get_exec = lambda e=ex: e
        f4.is_cuda = lambda: True
        f4.get_device_capability = lambda c=tuple(cap): c
        f4.initialize_fp4_gemm_config()
        f8.initialize_fp8_gemm_config()
        view = types.SimpleNamespace(quantization="modelopt_fp4", moe_runner_backend="auto", moe_a2a_backend="none")
        moe = ov._moe_runner_backend_quant_constraints(view).get("moe_runner_backend", "auto")
        out[arch] = {"fp4": f4.FP4_GEMM_RUNNER_BACKEND.value, "fp8": f8.FP8_GEMM_RUNNER_BACKEND.value, "moe": moe}
spec = {}
for target in ("flashinfer_cutlass", "flashinfer_trtllm", "triton", "marlin", "flashinfer_megamoe", "lora_triton"):
    v = types.SimpleNamespace(speculative_moe_runner_backend=None, moe_runner_backend=target)
    spec[target] = ov._speculative_moe_runner_default(v)["speculative_moe_runner_backend"]
print(json.dumps({"arch": out, "spec": spec}))
'''


@pytest.fixture(scope="module")
def sglang_auto() -> dict:
    head = _CELL.split("import sglang.srt.model_executor.pool_configurator as pc")[0]
    env = dict(os.environ, PYTHONPATH=str(ensure_sglang()))
    proc = subprocess.run([sys.executable, "-c", head + _AUTO, ",".join(STUBBED), ",".join(REAL_CONFIGS),
                           json.dumps(CAPS)], input="[]", capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _facts(arch: str, quant: str = "nvfp4", **kw) -> PlanFacts:
    base = dict(arch=arch, quant=quant, attention="gqa", moe=True, interconnect="pcie", spec=True,
                goal="latency", model_type="qwen3_5_moe")
    return PlanFacts(**{**base, **kw})


def _rule_auto(setting: str, facts: PlanFacts) -> str | None:
    entry = first_match(engine_rules("sglang")["settings"][setting].get("auto", []), facts)
    return entry["value"] if entry else None


@pytest.mark.parametrize("arch", sorted(CAPS))
def test_fp4_gemm_auto_rule_is_sglangs_own_resolution(sglang_auto, arch) -> None:
    assert _rule_auto("fp4_gemm_backend", _facts(arch)) == sglang_auto["arch"][arch]["fp4"]


def test_fp4_gemm_auto_on_sm120_is_cutlass_not_cudnn(sglang_auto) -> None:
    # the SM120 -> flashinfer_cudnn rule of sgl-project/sglang PR #20047 is gone in 0.5.23
    assert {sglang_auto["arch"][a]["fp4"] for a in ("sm110", "sm120", "sm121")} == {"flashinfer_cutlass"}
    assert {sglang_auto["arch"][a]["fp4"] for a in ("sm100", "sm103")} == {"flashinfer_cutedsl"}


@pytest.mark.parametrize("arch", ["sm110", "sm120", "sm121"])
def test_fp8_gemm_auto_rule_where_sglang_resolves_it_at_startup(sglang_auto, arch) -> None:
    assert _rule_auto("fp8_gemm_backend", _facts(arch, "fp8_block")) == sglang_auto["arch"][arch]["fp8"]


def test_fp8_gemm_auto_elsewhere_is_resolved_per_call(sglang_auto) -> None:
    # SM80-SM103 stay `auto` until _dispatch_auto_backend runs per GEMM (DeepGEMM if installed, ...):
    # the rule's entries there cite that function rather than initialize_fp8_gemm_config.
    for arch in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm103"):
        assert sglang_auto["arch"][arch]["fp8"] == "auto"
        entry = first_match(engine_rules("sglang")["settings"]["fp8_gemm_backend"]["auto"], _facts(arch, "fp8_block"))
        assert entry and "_dispatch_auto_backend" in entry["source"]


@pytest.mark.parametrize("arch", sorted(CAPS))
def test_nvfp4_moe_runner_auto_rule_matches_sglang(sglang_auto, arch) -> None:
    resolved = sglang_auto["arch"][arch]["moe"]
    entry = first_match(engine_rules("sglang")["settings"]["moe_runner_backend"]["auto"], _facts(arch))
    assert entry is not None
    if resolved != "auto":  # decided from server args (SM110 / SM12x)
        assert entry["value"] == resolved and "_moe_runner_backend_quant_constraints" in entry["source"]
    else:  # decided when the MoE layer builds its runner: the rule must cite that code
        assert "create_moe_runner" in entry["source"]


def test_draft_runner_inherits_the_targets_resolved_runner(sglang_auto) -> None:
    spec = sglang_auto["spec"]
    assert all(spec[t] == t for t in ("flashinfer_cutlass", "flashinfer_trtllm", "triton", "marlin"))
    assert spec["flashinfer_megamoe"] == "flashinfer_trtllm" and spec["lora_triton"] == "auto"


SYMPTOMS = ("fails at startup", "refused", "garbage", "nan", "crash", "fault", "wrong", "error")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_avoid_reason_names_what_the_user_sees(engine) -> None:
    for name, setting in engine_rules(engine)["settings"].items():
        for bad in setting.get("bad", []):
            assert any(s in bad["reason"].lower() for s in SYMPTOMS), f"{name} {bad['value']}: {bad['reason']}"


@pytest.fixture(scope="module")
def sm120_plan(qwen35_report):
    return make_plan(qwen35_report.checkpoint, qwen35_report.mtp, gpu="rtx-pro-6000", gpus=8)


def test_sm120_plan_picks_cudnn_fp4_gemm_and_cutlass_moe(sm120_plan) -> None:
    """Issue 34 §1: the 397B NVFP4 quant on 8x RTX PRO 6000 gets the combination proven on SM120."""
    cmd = sm120_plan.commands["sglang"]
    flags = {f.flag: f for f in cmd.flags}
    autos = {a.flag: a for a in cmd.engine_auto}
    assert flags["--moe-runner-backend"].value == "flashinfer_cutlass"
    assert flags["--fp4-gemm-backend"].value == "flashinfer_cudnn"
    # the plan overrides the engine's auto on purpose, and says so
    assert autos["--fp4-gemm-backend"].value == "flashinfer_cutlass"
    assert autos["--fp4-gemm-backend"].plan_value == "flashinfer_cudnn"
    reason = flags["--fp4-gemm-backend"].reason
    assert "Requires: CUDA 13" in reason and "cuDNN backend 9.15" in reason
    avoid = {(a.flag, a.value): a for a in cmd.avoid}
    cutlass = avoid[("--fp4-gemm-backend", "flashinfer_cutlass")]
    assert "NaN" in cutlass.reason and "#20043" in cutlass.source
    for backend in ("flashinfer_trtllm", "flashinfer_cutedsl"):
        assert ("--fp4-gemm-backend", backend) in avoid and ("--moe-runner-backend", backend) in avoid


def _sglang_file(rel: str) -> str:
    return (ensure_sglang() / "sglang" / "srt" / rel).read_text(encoding="utf-8")


def test_sm120_fp4_pick_rests_on_sglang_0_5_23s_own_code() -> None:
    """The cuDNN pick is justified only while the engine the plan targets still resolves SM12x to CUTLASS
    without any SM120 NaN handling: if a release brings back an SM120 branch (or a fix note for
    sglang#20043), this test fails and the rule has to be re-decided from the new code."""
    fp4_utils = _sglang_file("layers/quantization/fp4_utils.py")
    init = fp4_utils[fp4_utils.index("def initialize_fp4_gemm_config"):fp4_utils.index("def get_fp4_gemm_runner_backend")]
    assert "sm120" not in init.lower() and "20043" not in fp4_utils and "flashinfer_cudnn" not in init
    pick = first_match(engine_rules("sglang")["settings"]["fp4_gemm_backend"]["picks"], _facts("sm120"))
    assert pick["value"] == "flashinfer_cudnn"
    assert "sgl-project/sglang#20043" in pick["source"] and "PR #20047" in pick["source"]


def test_sm120_cudnn_requirements_are_the_engines_own() -> None:
    """The versions the plan asks the user to install are the ones SGLang 0.5.23's help names for cuDNN."""
    import re

    exec_help = _sglang_file("arg_groups/fields/exec_.py")
    m = re.search(r"'flashinfer_cudnn' \(FlashInfer cuDNN backend, optimal on CUDA (\d+)\+ with cuDNN ([\d.]+)\+\)",
                  exec_help)
    assert m, "SGLang's --fp4-gemm-backend help no longer states the cuDNN requirement"
    pick = first_match(engine_rules("sglang")["settings"]["fp4_gemm_backend"]["picks"], _facts("sm120"))
    assert f"CUDA {m.group(1)}" in pick["reason"] and f"cuDNN backend {m.group(2)}" in pick["reason"]


def test_sm120_avoid_list_names_each_symptom() -> None:
    settings = engine_rules("sglang")["settings"]
    bad = {(name, b["value"]): b["reason"] for name in ("fp4_gemm_backend", "moe_runner_backend")
           for b in settings[name]["bad"] if "sm120" in b["when"].get("arch", [])}
    assert "NaN" in bad[("fp4_gemm_backend", "flashinfer_cutlass")]
    assert "BackendSupportedError" in bad[("fp4_gemm_backend", "flashinfer_trtllm")]
    assert "CUDA 13" in bad[("fp4_gemm_backend", "flashinfer_cutedsl")]
    assert "degenerate" in bad[("moe_runner_backend", "flashinfer_trtllm")]
    assert "garbage" in bad[("moe_runner_backend", "triton")]


def test_sm120_plan_text_and_report_print_the_pick_and_the_avoided(cli, qwen35_replica) -> None:
    for args in (("plan", str(qwen35_replica), "--gpu", "rtx-pro-6000", "--gpus", "8", "--engine", "sglang"),
                 ("report", str(qwen35_replica), "--gpu", "rtx-pro-6000", "--gpus", "8")):
        out = cli(*args, "--wide", timeout=300)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert "--fp4-gemm-backend flashinfer_cudnn" in text
        assert "Requires: CUDA 13" in text
        avoid = text[text.index("Avoid on this GPU:"):]
        assert "--fp4-gemm-backend flashinfer_cutlass: NaN rows" in avoid
        assert "sgl-project/sglang#20043" in avoid
