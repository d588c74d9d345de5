"""Plan claims from the engines' own code: every environment variable a plan can set exists in that
engine's registry, every divisibility rule cites the engine's lines, and a check the engine only warns
about leaves a plan (with the warning).

The registries are the installed engines' own: ``vllm.envs.environment_variables`` of vLLM's CPU build
0.32.0 and the ``EnvField`` attributes of ``sglang.srt.environ.Envs`` of SGLang 0.5.23, each read in a
subprocess of that engine's environment (tests/vllm_engine.py, tests/sglang_parser.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ckptinspect.pipeline import build_report
from ckptinspect.plan import make_plan
from ckptinspect.plan.gpus import load_gpus
from ckptinspect.plan.rules import engine_rules
from fixtures.nemotron_lightning import build_lightning_replica

ROOT = Path(__file__).resolve().parent.parent
ENV_NAME = re.compile(r"\b((?:VLLM|SGLANG|SGL)_[A-Z0-9_]+)=")


@pytest.fixture(scope="module")
def vllm_registry() -> set[str]:
    from vllm_engine import engine_python

    python = engine_python()
    proc = subprocess.run([python, "-c", "import json, vllm.envs as e; print(json.dumps(sorted(e.environment_variables)))"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def sglang_registry() -> set[str]:
    from sglang_parser import ensure_sglang

    code = ("import json, sglang.srt.environ as e; "
            "print(json.dumps(sorted(n for n, v in vars(e.Envs).items() if isinstance(v, e.EnvField))))")
    env = dict(os.environ, PYTHONPATH=str(ensure_sglang()))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def lightning(tmp_path_factory):
    """The full-scale NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4 layout (sparse shards) through the pipeline."""
    path, _ = build_lightning_replica(tmp_path_factory.mktemp("lightning"))
    return build_report(str(path), progress=False)


def _rule_env_names() -> dict[str, set[str]]:
    """Every variable an engine rule file sets (``env`` entries) or tells the user to set (``NAME=`` in any
    text), per engine; plus the ones ckptinspect/plan/*.py writes into notes."""
    out: dict[str, set[str]] = {"vllm": set(), "sglang": set()}
    for engine in out:
        doc = yaml.safe_load((ROOT / "rules" / "engines" / f"{engine}.yaml").read_text(encoding="utf-8"))
        out[engine] |= {e["name"] for e in doc.get("env", [])}
    texts = [p.read_text(encoding="utf-8") for p in (ROOT / "ckptinspect" / "plan").glob("*.py")]
    texts += [(ROOT / "rules" / "engines" / f).read_text(encoding="utf-8") for f in ("common.yaml", "sglang.yaml", "vllm.yaml")]
    for text in texts:
        for name in ENV_NAME.findall(text):
            out["vllm" if name.startswith("VLLM_") else "sglang"].add(name)
    return out


def test_the_registries_are_the_engines_own(vllm_registry, sglang_registry):
    """Not vacuous: the registries hold the variables the engines read, and lack the one the plan used
    to set (vLLM 0.32.0 logs 'Unknown vLLM environment variable detected' for it)."""
    assert {"VLLM_USE_DEEP_GEMM", "VLLM_USE_FLASHINFER_SAMPLER"} <= vllm_registry
    assert "VLLM_USE_FLASHINFER_MOE_FP4" not in vllm_registry
    assert "VLLM_USE_FLASHINFER_MOE_FP8" not in vllm_registry
    assert {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_ENABLE_JIT_DEEPGEMM"} <= sglang_registry


def test_every_variable_the_rules_name_exists_in_the_engine(vllm_registry, sglang_registry):
    names = _rule_env_names()
    assert names["vllm"], "the vLLM rules set no variable at all: the check would be vacuous"
    assert sorted(names["vllm"] - vllm_registry) == []
    assert sorted(names["sglang"] - sglang_registry) == []


def test_no_plan_sets_a_variable_the_engine_does_not_define(vllm_registry, sglang_registry, qwen35_report, lightning):
    """The commands of real plans on every listed GPU (the full-scale Qwen3.5-397B NVFP4 and
    Nemotron-3.5-Lightning layouts): each env assignment is in its engine's registry."""
    seen: dict[str, set[str]] = {"vllm": set(), "sglang": set()}
    for report in (qwen35_report, lightning):
        for gpu in load_gpus():
            for gpus in (1, 8):
                try:
                    plan = make_plan(report.checkpoint, report.mtp, gpu=gpu.name, gpus=gpus)
                except Exception:  # noqa: BLE001 - a plan that does not fit sets nothing
                    continue
                for engine, command in plan.commands.items():
                    if engine in seen:
                        seen[engine] |= {e.name for e in command.env}
    assert sorted(seen["vllm"] - vllm_registry) == []
    assert sorted(seen["sglang"] - sglang_registry) == []


def test_divisibility_rules_cite_the_engines_lines():
    """No rule whose source says it was derived: each names SG: / VL: code with a line (the schema enforces
    the form; this also reads every rule file under rules/ for the word)."""
    for rule in engine_rules("common")["divisibility"]:
        assert re.match(r"^(SG|VL):[^ ]+:\d", rule["source"]), rule["id"]
        assert rule["severity"] in ("error", "warning")
    for path in (ROOT / "rules").rglob("*.yaml"):
        assert "derived" not in path.read_text(encoding="utf-8").lower().replace("derive_", ""), path


def test_lightning_plan_on_one_rtx_pro_6000_prints_a_command(lightning):
    """moe_intermediate_size 1856 at MoE-TP 1: SGLang's FusedMoE divides it, the NVFP4 scale takes 116
    columns (a multiple of 4) and relu2 experts are not gated, so no engine check fails or warns."""
    plan = make_plan(lightning.checkpoint, lightning.mtp, gpu="rtx-pro-6000", gpus=1)
    assert (plan.chosen.memory.tp, plan.chosen.memory.ep) == (1, 1)
    assert not [c for c in plan.chosen.checks if not c.ok]
    assert "--tp-size 1" in plan.commands["sglang"].shell()
    assert "vllm serve" in plan.commands["vllm"].shell()
    assert plan.chosen.fits


def test_a_check_the_engine_only_warns_about_leaves_a_plan_with_the_warning(lightning):
    """TP 2 without EP: 928 rows per rank, 58 scale columns, not a multiple of 4. SGLang logs
    "NVFP4 w2_weight_scale K' not multiple of 4" and pads; the plan runs and carries that warning."""
    plan = make_plan(lightning.checkpoint, lightning.mtp, gpu="rtx-pro-6000", gpus=2)
    assert plan.chosen.memory.tp == 2 and plan.chosen.memory.ep == 1
    warned = [c for c in plan.chosen.checks if c.warns]
    assert [c.id for c in warned] == ["nvfp4-moe-scale-k4"] and plan.chosen.loads
    assert any(n.severity == "warning" and "58" in n.message and "not multiple of 4" in n.message for n in plan.notes)


def test_an_engine_error_still_refuses(lightning):
    """The refusal is not gone: MoE-TP 32 leaves 58 rows per rank, which SGLang's FusedMoE divides but the
    NVFP4 group of 16 does not; EP fixes it (the rule's fix), so the plan picks EP."""
    from ckptinspect.plan.fit import run_checks
    from ckptinspect.plan.plan import quant_kind_of
    from ckptinspect.plan.rules import PlanFacts

    ck = lightning.checkpoint
    facts = PlanFacts(arch="sm120", quant=quant_kind_of(ck), attention=ck.config.attention_kind, moe=True,
                      interconnect="pcie", spec=False, goal="latency", model_type=ck.config.model_type)
    failed = {c.id for c in run_checks(lightning.checkpoint, facts, 32, 1) if c.blocks}
    assert failed == {"nvfp4-moe-scale-group"}
    assert not [c for c in run_checks(lightning.checkpoint, facts, 32, 32) if c.blocks]


def test_audit_fit_of_the_lightning_layout(lightning, cli):
    """About 21 GB stored, on one 96 GB RTX PRO 6000: the report's plan (what `audit` reads its "fits"
    column from, ckptinspect/audit/row.py _fit) is a plan, not a refusal."""
    from ckptinspect.audit.row import _fit

    assert 20e9 < lightning.checkpoint.inventory.totals.bytes < 22.5e9
    proc = cli("report", lightning.checkpoint.location, "--gpu", "rtx-pro-6000", "--gpus", "1", "--format", "json",
               "--quiet")
    assert proc.returncode == 0, proc.stderr
    fit = _fit(json.loads(proc.stdout)["plan"])
    assert fit["fits"] is True and fit["gpus_used"] == 1
