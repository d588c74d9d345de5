"""`plan` for GGUF checkpoints: a llama-server command whose flags are the rule file's (llama.cpp's own
names), MTP flags only when the head is usable, a companion head loaded with its flag, and GPU layers /
context that fit the memory model."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402

from ckptinspect import api  # noqa: E402
from ckptinspect.errors import PlanError  # noqa: E402
from ckptinspect.pipeline import build_report  # noqa: E402
from ckptinspect.plan.llamacpp import GIB, RESERVE_BYTES, USABLE_SHARE, plan_llamacpp  # noqa: E402
from ckptinspect.rules.gguf_engine import gguf_engine_rules  # noqa: E402
from fixtures.gguf_models import MODEL_DIRS, MODELS, build  # noqa: E402

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    build(root, ["GLM-4.5-Air-Q4_K_M", "GLM-4.5-Air-trunk-Q4_K_M", "GLM-4.5-Air-plain-Q4_K_M", "GLM-4.5-Air-Q8_0",
                 "GLM-4.5-Air-IQ3_S"])
    return {name: root / MODEL_DIRS[name] for name in MODELS}


def _args(plan) -> dict[str, str | None]:
    return {f.flag: f.value for f in plan.flags}


def test_head_inside_gets_mtp_flags_from_the_rule_file(models):
    plan = api.plan(str(models["GLM-4.5-Air-Q4_K_M"]), gpu="h200", gpus=1)
    flags = gguf_engine_rules()["flags"]
    args = _args(plan)
    assert args[flags["spec_type"]["flag"]] == "draft-mtp" == flags["spec_type"]["value"]
    assert args[flags["draft_n_max"]["flag"]] == str(flags["draft_n_max"]["value"])
    assert flags["draft_model"]["flag"] not in args
    assert args["-ngl"] == "999" and plan.gpu_layers == plan.total_layers == 4
    assert plan.command[0] == "llama-server" and all(f.reason and f.source for f in plan.flags)


def test_companion_head_is_loaded_with_the_draft_model_flag(models):
    plan = api.plan(str(models["GLM-4.5-Air-trunk-Q4_K_M"]), gpu="h200", gpus=1)
    args = _args(plan)
    assert args["-md"].endswith("/mtp-GLM-4.5-Air-trunk-Q8_0.gguf")
    assert args["--spec-type"] == "draft-mtp"


def test_no_head_means_no_mtp_flags_and_degraded_head_drafts_short(models):
    plain = _args(api.plan(str(models["GLM-4.5-Air-plain-Q4_K_M"]), gpu="h200", gpus=1))
    assert "--spec-type" not in plain and "--spec-draft-n-max" not in plain
    low = api.plan(str(models["GLM-4.5-Air-IQ3_S"]), gpu="h200", gpus=1)
    assert low.mtp == "degraded" and _args(low)["--spec-draft-n-max"] == "2"


def test_split_set_is_opened_by_its_first_part(models):
    plan = api.plan(str(models["GLM-4.5-Air-Q8_0"]), gpu="h200", gpus=1)
    assert _args(plan)["-m"].endswith("GLM-4.5-Air-Q8_0-00001-of-00003.gguf")


def test_layers_that_do_not_fit_stay_on_the_host(models):
    """Blow the fixture's tensors up to ~GB sizes: -ngl offloads only what fits, within the GPU budget."""
    report = build_report(str(models["GLM-4.5-Air-Q4_K_M"]), progress=False)
    inv = report.checkpoint.inventory
    big = dataclasses.replace(inv, groups=tuple(dataclasses.replace(g, bytes=g.bytes * 12_000) for g in inv.groups))
    ck = dataclasses.replace(report.checkpoint, inventory=big)
    plan = plan_llamacpp(ck, report.mtp, gpu="rtx-5090", gpus=1, context=8192)
    from ckptinspect.plan.gpus import find_gpu

    budget = int(find_gpu("rtx-5090").memory_gib * GIB * USABLE_SHARE - RESERVE_BYTES)
    assert 0 < plan.gpu_layers < plan.total_layers
    assert _args(plan)["-ngl"] == str(plan.gpu_layers)
    assert plan.gpu_weight_bytes + plan.kv_bytes <= budget
    two = plan_llamacpp(ck, report.mtp, gpu="rtx-5090", gpus=2, context=8192)
    assert two.gpu_layers > plan.gpu_layers


def test_wrong_engine_for_a_gguf_is_one_line(models):
    with pytest.raises(PlanError, match="GGUF checkpoint"):
        api.plan(str(models["GLM-4.5-Air-Q4_K_M"]), gpu="h200", gpus=1, engine="sglang")
    result = run_cli("plan", str(models["GLM-4.5-Air-Q4_K_M"]), "--gpu", "h200", "--gpus", "1", "--engine", "vllm")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    ok = run_cli("plan", str(models["GLM-4.5-Air-Q4_K_M"]), "--gpu", "h200", "--gpus", "1", "--format", "json")
    assert ok.returncode == 0 and '"engine": "llamacpp"' in ok.stdout
