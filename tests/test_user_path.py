"""Issue 34 §4: what a first-time deployer reads must not contradict itself. Each test runs the CLI in a
subprocess and fails on the main branch the issue was filed against."""

from __future__ import annotations

import json
import re

from conftest import run_cli


def _share(doc: dict) -> tuple[str, float]:
    schemes, total = doc["quantization"]["schemes"], doc["totals"]["bytes"]
    top = max(schemes, key=lambda k: (schemes[k]["bytes"], k))
    return top, 100 * schemes[top]["bytes"] / total


def test_stored_quantization_is_shown_beside_the_declared_one(make_fixture) -> None:
    """A config may declare another scheme than the weights hold (DeepSeek-V4 NVFP4 said "fp8"): the
    summary and audit's quant column show what is stored, by share of bytes, next to the declaration."""
    model = str(make_fixture("deepseek_v4_flash_nvfp4"))
    doc = json.loads(run_cli("report", model, "--format", "json", "--quiet").stdout)
    top, share = _share(doc)
    label = f"{top} {share:.1f}%"
    text = run_cli("report", model, "--quiet", "--wide").stdout
    assert re.search(rf"Declared quantization\s+{re.escape(doc['quantization']['declared'])}\n", text)
    assert re.search(rf"Stored \(share of bytes\)\s+{re.escape(label)}", text), text[:1500]
    audit = run_cli("audit", model, "--no-cache", "--quiet", "--wide")
    assert audit.returncode == 0, audit.stderr
    assert f"{doc['quantization']['declared']} / {label}" in audit.stdout


def test_audit_and_report_print_the_same_bytes_in_the_same_unit(make_fixture) -> None:
    model = str(make_fixture("deepseek_v4_flash_nvfp4"))
    report = run_cli("report", model, "--quiet", "--wide").stdout
    size = re.search(r"Tensors / params / size\s+\S+ / \S+ / (\S+ \S+)", report).group(1)
    assert size.endswith("iB")  # binary: KiB / MiB / GiB
    audit = run_cli("audit", model, "--no-cache", "--quiet", "--wide").stdout
    assert f" {size} " in audit and not re.search(r"\d (kB|MB|GB|TB) ", audit)


def test_audit_fit_never_says_yes_with_a_minimum_above_what_it_uses(qwen35_replica) -> None:
    """main: "yes, 4 used, min 8" (`fits: true, min_gpus: 8, gpus_used: 4`) for the 397B NVFP4 replica on
    4x H100 at a 1M-token context, which runs there only with the max-context solver's settings."""
    args = ("audit", str(qwen35_replica), "--gpu", "h100", "--gpus", "4", "--context", "1000000", "--no-cache",
            "--quiet")
    doc = json.loads(run_cli(*args, "--format", "json", timeout=300).stdout)
    fit = doc["rows"][0]["fit"]
    assert fit["fits"] is True and fit["min_gpus"] <= fit["gpus_used"] == 4, fit
    assert "solver" in fit["reason"] and "8 GPUs" in fit["reason"]
    text = run_cli(*args, "--wide", timeout=300).stdout
    assert "yes, 4 used (solver settings)" in text and "min 8" not in text


def test_gpu_suggestions_never_name_another_product_and_find_the_alias() -> None:
    gh = run_cli("plan", "x", "--gpu", "gh200", "--gpus", "1")
    assert gh.returncode == 2 and "did you mean" not in gh.stderr  # GH200 is Grace Hopper, not an H200
    rtx = run_cli("plan", "x", "--gpu", "rtx6000", "--gpus", "1")
    assert rtx.returncode == 2 and "did you mean rtx6000-pro?" in rtx.stderr
    typo = run_cli("plan", "x", "--gpu", "h2000", "--gpus", "1")
    assert "did you mean h200?" in typo.stderr  # a doubled character is still the same card


def test_snapshot_refuses_a_directory_that_does_not_exist(tmp_path) -> None:
    target = tmp_path / "NOSUCHDIR" / "sub" / "x.json.gz"
    done = run_cli("snapshot", "ckptinspect/examples/qwen3_5_moe_nvfp4_tiny", "-o", str(target))
    assert done.returncode == 2 and "does not exist" in done.stderr and "NOSUCHDIR" in done.stderr
    assert not (tmp_path / "NOSUCHDIR").exists()


def test_plan_context_above_the_model_max_sets_the_engines_variable(qwen35_replica) -> None:
    done = run_cli("plan", str(qwen35_replica), "--gpu", "b200", "--gpus", "8", "--context", "2000000", "--quiet",
                   "--wide", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang.launch_server" in done.stdout
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in done.stdout


def test_library_plan_that_cannot_be_made_raises_like_an_unknown_gpu(make_fixture) -> None:
    """main: api.plan returned a PlanFailure (the next `plan.commands` was an AttributeError) while an unknown
    GPU raised; both are PlanError now, the failure record travels on the exception."""
    import pytest

    from ckptinspect import api
    from ckptinspect.errors import CkptInspectError, PlanError, PlanNotPossible

    with pytest.raises(PlanError):
        api.plan(str(make_fixture("qwen3_5_moe_nvfp4")), gpu="no-such-gpu", gpus=8)
    # The tiny example now plans on 8x H200 (TP 2, idle GPUs allowed: plan/memory.py), so the plan that
    # cannot be made is the same model on H200s given 0.5 MiB each: no static pool fits anywhere.
    from dataclasses import replace

    tiny_h200 = replace(api.find_gpu("h200"), memory_gib=0.0005)
    with pytest.raises(PlanNotPossible) as raised:
        api.plan("ckptinspect/examples/qwen3_5_moe_nvfp4_tiny", gpu=tiny_h200, gpus=8)
    assert isinstance(raised.value, CkptInspectError) and raised.value.failure.ok is False
    assert raised.value.failure.options and "does not run on 8x H200-SXM" in str(raised.value)


def test_the_package_lists_its_public_api_and_ships_type_information() -> None:
    import importlib.resources

    import ckptinspect

    names = dir(ckptinspect)
    for name in ("inspect", "gate", "snapshot", "find_gpu", "api", "CkptInspectError", "PlanNotPossible"):
        assert name in names and name in ckptinspect.__all__
    assert "Any" not in names
    for name in ckptinspect.__all__:
        assert getattr(ckptinspect, name) is not None, name
    assert ckptinspect.PlanNotPossible.__mro__[1].__name__ == "PlanError"
    assert importlib.resources.files("ckptinspect").joinpath("py.typed").is_file()
