"""`report` / `audit --verify-engine`: the engine's own dry-load next to the rules' verdict (issue 31 item 1).

SGLang 0.5.23 (the pip --target test install, tests/test_verify.py sglang_environment) dry-loads DeepSeek-V3
block-FP8 replicas at real dimensions (tests/test_verify.py _deepseek):
- as stored: the rules say ready and the dry-load loads: they agree, the verdict is the rules' grade, the
  basis is the engine, no finding;
- the MTP layer's ``enorm`` stored as FP8 codes: the rules say ready (no rule looks at a norm's dtype) and
  SGLang's loader copies the codes into its BF16 norm parameter (defects): the verdict is the dry-load's
  (unusable), shown once, with a rules-disagree-with-engine warning naming the module, and
  `--fail-on unusable` trips on it. (Until issue 31's fix this case was one routed MTP expert stored BF16
  among FP8 experts, which the rules now judge unusable themselves: mtp-group-member-stored-unlike-built.)
- no engine environment (no interpreter; an interpreter without SGLang): one error line, exit 2, before
  anything is read: a user who asked for the engine's answer never gets a rules-only report instead.
`audit --verify-engine` reads both replicas from a local Hub and dry-loads them in one SGLang process.
The decision itself (verify/decide.py) is also checked without an engine: not decided (platform refusal,
another version, no answer) keeps the rules' verdict and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    from tests.test_verify import _deepseek

    tmp = tmp_path_factory.mktemp("verify-report")
    return {"as-stored": _deepseek(tmp, "as-stored"), "fp8-norm": _deepseek(tmp, "fp8-norm", _fp8_norm)}


def _fp8_norm(tensors):
    from dataclasses import replace

    return [replace(t, dtype="F8_E4M3") if t.name == "model.layers.4.enorm.weight" else t for t in tensors]


@pytest.fixture(scope="module")
def sglang_args():
    from tests.test_verify import sglang_environment

    python, path = sglang_environment()
    return ["--verify-engine", "sglang", "--engine-python", python, "--engine-pythonpath", path]


@pytest.fixture(scope="module")
def reports(replicas, sglang_args):
    """(JSON document, text) of `report --verify-engine sglang` for each replica."""
    from ckptinspect.render.json_out import validate_report_json

    out = {}
    for name, path in replicas.items():
        done = run_cli("report", str(path), *sglang_args, "--format", "json", "--deadline", "900", timeout=900)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        validate_report_json(doc)
        text = run_cli("report", str(path), *sglang_args, "--wide", "--deadline", "900", timeout=900)
        assert text.returncode == 0, text.stderr
        out[name] = (doc, text.stdout)
    return out


def _codes(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


def test_agreement_keeps_the_rules_grade_with_the_engine_as_basis(reports):
    doc, text = reports["as-stored"]
    entry = doc["mtp"]["engines"]["sglang"]
    assert (entry["basis"], entry["verdict"], doc["mtp"]["verdict"]["sglang"]) == ("engine", "ready", "ready")
    check = entry["dry_load"]
    assert (check["decided"], check["agrees"], check["outcome"], check["engine_version"]) == \
        (True, True, "loads", "0.5.23")
    assert entry["engine_version"] == "0.5.23"  # the rules judged the installed release
    assert "rules-disagree-with-engine" not in _codes(doc)
    assert "basis" not in doc["mtp"]["engines"]["vllm"]  # not asked: the rules' answer, as without the option
    lines = [line for line in text.splitlines() if line.startswith("sglang ") and "dry-load" in line]
    assert len(lines) == 1 and "loads; verdict ready, the rules agree" in lines[0], text


def test_disagreement_is_one_verdict_and_a_finding_naming_the_module(reports, replicas, sglang_args):
    doc, text = reports["fp8-norm"]
    entry = doc["mtp"]["engines"]["sglang"]
    assert (entry["basis"], entry["verdict"], doc["mtp"]["verdict"]["sglang"]) == ("engine", "unusable", "unusable")
    assert entry["dry_load"]["rules_verdict"] == "ready" and entry["dry_load"]["agrees"] is False
    assert entry["reasons"] == ["rules-disagree-with-engine"]
    [finding] = [f for f in doc["findings"] if f["code"] == "rules-disagree-with-engine"]
    assert (finding["severity"], finding["engine"]) == ("warning", "sglang")
    assert finding["subject"] == "model.enorm.weight"
    assert "the rules say ready" in finding["message"] and "defects" in finding["message"]
    # text: the readiness table shows the one verdict; the engine line and the finding say why
    readiness = text.split("MTP readiness", 1)[1].split("\n\n", 1)[0]
    assert "UNUSABLE" in readiness.upper().split("SGLANG", 1)[1].splitlines()[0]
    assert "verdict unusable from the engine (the rules said ready: rules-disagree-with-engine)" in text
    # the gate reads the same verdict
    gate = run_cli("report", str(replicas["fp8-norm"]), *sglang_args, "--fail-on", "unusable", "--engine",
                   "sglang", "--format", "json", "--deadline", "900", timeout=900)
    assert gate.returncode == 1 and "sglang=unusable" in gate.stderr, gate.stderr


@pytest.mark.parametrize("case", ["no interpreter", "no sglang there"])
def test_no_engine_environment_is_one_line_exit_2(case, replicas, tmp_path):
    if case == "no interpreter":
        args = ["--engine-python", str(tmp_path / "missing" / "python")]
    else:  # this Python, without the SGLang install's PYTHONPATH
        args = ["--engine-python", sys.executable, "--engine-pythonpath", str(tmp_path)]
    for command in (["report", str(replicas["as-stored"])], ["audit", "org/x"]):
        done = run_cli(*command, "--verify-engine", "sglang", *args)
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
        assert done.stdout == ""  # nothing read, nothing printed: never a rules-only answer
        assert ("no executable Python" if case == "no interpreter" else "sglang is not installed") in lines[0]


def test_audit_dry_loads_every_repo_in_one_engine_process(replicas, sglang_args, tmp_path):
    from ckptinspect.render.audit_out import validate_audit_json
    from tests.hub_server import HubServer

    env = dict(os.environ)
    env.pop("CKPTINSPECT_DEBUG", None)
    env["CKPTINSPECT_CACHE_DIR"] = str(tmp_path / "cache")
    with HubServer() as srv:
        for name, path in replicas.items():
            srv.add_repo(f"org/{name}", path)
        env["HF_ENDPOINT"] = srv.url
        # --engine sglang: the rows sort by SGLang's verdict, the one the dry-load decides (with both engines
        # the rules' vLLM 'ready' ties them and the smaller checkpoint would come first)
        done = subprocess.run([sys.executable, "-m", "ckptinspect", "audit", "org/as-stored", "org/fp8-norm",
                               *sglang_args, "--engine", "sglang", "--format", "json", "--full", "--deadline", "900"],
                              capture_output=True,
                              text=True, env=env, cwd=str(ROOT), timeout=900)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        validate_audit_json(doc)
        rows = {row["repo"]: row for row in doc["rows"]}
        text = subprocess.run([sys.executable, "-m", "ckptinspect", "audit", "org/as-stored", "org/fp8-norm",
                               *sglang_args, "--wide", "--deadline", "900"], capture_output=True, text=True,
                              env=env, cwd=str(ROOT), timeout=900)
    assert rows["org/as-stored"]["verdict"]["sglang"] == "ready"
    assert rows["org/as-stored"]["engine_check"]["sglang"]["agrees"] is True
    bad = rows["org/fp8-norm"]
    assert bad["verdict"]["sglang"] == "unusable" and bad["verdict"]["vllm"] == "ready"
    assert bad["engine_check"]["sglang"]["rules_verdict"] == "ready"
    assert "rules-disagree-with-engine" in _codes(bad["report"])  # --full: the repo's report, as `report` gives it
    assert bad["report"]["mtp"]["engines"]["sglang"]["basis"] == "engine"
    assert doc["rows"][0]["repo"] == "org/as-stored"  # sorted by the verdict the dry-load decided
    assert text.returncode == 0, text.stderr
    assert "org/fp8-norm: sglang: sglang 0.5.23 dry-load: defects" in text.stdout, text.stdout


# -- the decision without an engine (verify/decide.py) --------------------------------------------
def _result(outcome: str, version: str = "0.5.23", steps=()):
    from ckptinspect.verify.records import VerifyResult

    return VerifyResult(ref="x", location="x", engine="sglang", engine_version=version, python="py", outcome=outcome,
                        method=None, draft_architectures=(), draft_class=None, quantization=None, quant_config=None,
                        steps=tuple(steps), modules=(), tensors_offered=0, mtp_tensors_loaded=0,
                        mtp_tensors_skipped=(), mtp_tensor_targets=(), other_tensors_loaded=(),
                        other_tensors_skipped=0, shims=(), not_run=(), seconds=1.0)


def test_what_the_engine_cannot_decide_keeps_the_rules_verdict_and_says_why():
    from ckptinspect.verify.decide import engine_check, finding
    from ckptinspect.verify.records import StepOutcome

    refused = StepOutcome(step="build draft on meta", ok=False, seconds=0.1, error="RuntimeError: no CUDA GPUs",
                          platform=True)
    cases = {
        "platform": (_result("not run", steps=[refused]), "the engine refused this machine"),
        "version": (_result("defects", version="0.5.24"), "the rules answered for sglang 0.5.23"),
        "no answer": ("org/x: not found", "org/x: not found"),
    }
    for name, (result, why) in cases.items():
        check = engine_check("sglang", "ready", "0.5.23", result)
        assert (check.decided, check.verdict, check.agrees) == (False, "ready", None), name
        assert why in check.not_decided and check.line().startswith("not decided by the engine: "), name
        extra = finding(check)
        assert (extra.code, extra.severity) == ("engine-check-not-decided", "info"), name
    # where the engine loads what the rules call unusable, the engine decides and the rules' modules are named
    check = engine_check("sglang", "unusable", "0.5.23", _result("loads"), rules_modules=("mtp.layers.0.fc",))
    assert (check.decided, check.verdict, check.agrees, check.modules) == (True, "ready", False, ("mtp.layers.0.fc",))
    assert finding(check).subject == "mtp.layers.0.fc"
    # a missing MTP layer the engine cannot load either: they agree, absent stays absent
    assert engine_check("sglang", "absent", "0.5.23", _result("load failed")).verdict == "absent"


def _answer(draft_architectures, target_architectures, loaded_mtp=(), loaded_other=("model.layers.0.mlp.w1",)):
    """An engine script's answer (engine_side/*_dryload.py) whose steps all ran and whose parameters loaded."""
    return {"engine_version": "0.5.23", "method": "NEXTN", "draft_architectures": list(draft_architectures),
            "target_architectures": list(target_architectures), "draft_class": draft_architectures[0],
            "steps": [{"step": "load weights", "ok": True, "seconds": 0.1}],
            "parameters": [{"name": "model.layers.0.mlp.w1.weight", "dtype": "bfloat16", "shape": [4, 4],
                            "status": "loaded", "calls": 1}],
            "tensors": {"offered": 2, "loaded_mtp": list(loaded_mtp), "skipped_mtp": [],
                        "loaded_other": list(loaded_other), "skipped_other": 0}}


def test_a_draft_built_as_the_target_class_without_mtp_tensors_is_a_target_copy():
    """SGLang 0.5.23 builds MiniMaxM2ForCausalLM itself as the NEXTN draft (configs/model_config.py
    _config_draft_model renames no M2 architecture) and loads the trunk into it: it loads, yet it is no MTP
    head. The outcome says so, and the decision maps it to the rules' unusable / absent."""
    from ckptinspect.render.verify_out import validate_verify_json, verify_json, verify_text
    from ckptinspect.verify.decide import engine_check, finding
    from ckptinspect.verify.outcome import result_from_answer

    m2 = ["MiniMaxM2ForCausalLM"]
    copy = result_from_answer("x", "x", "sglang", "py", _answer(m2, m2), 1.0)
    assert copy.outcome == "target copy" and copy.draft_is_target
    # the same answer with the draft architecture renamed (an MTP head) or with MTP tensors in it is not a copy
    nextn = _answer(["DeepseekV3ForCausalLMNextN"], ["DeepseekV3ForCausalLM"], ("model.layers.61.eh_proj.weight",))
    head = result_from_answer("x", "x", "sglang", "py", nextn, 1.0)
    assert head.outcome == "loads" and not head.draft_is_target
    same_class_with_mtp = result_from_answer(
        "x", "x", "sglang", "py", _answer(["M"], ["M"], loaded_mtp=("model.layers.3.eh_proj.weight",)), 1.0)
    assert same_class_with_mtp.outcome == "loads"
    # an older answer without the target's architectures cannot be called a copy
    old = _answer(["MiniMaxM2ForCausalLM"], [])
    assert result_from_answer("x", "x", "sglang", "py", old, 1.0).outcome == "loads"
    text = verify_text(copy)
    assert "TARGET COPY" in text and "draft is the target model, not an MTP head" in text
    validate_verify_json(json.loads(json.dumps(verify_json(copy))))
    for rules in ("unusable", "absent"):
        check = engine_check("sglang", rules, "0.5.23", copy)
        assert (check.decided, check.agrees, check.verdict) == (True, True, rules) and finding(check) is None
        assert "draft is the target model" in check.modules[0]
    # rules that call it ready are overruled: the engine decides unusable, and the finding says why
    check = engine_check("sglang", "ready", "0.5.23", copy)
    assert (check.decided, check.agrees, check.verdict) == (True, False, "unusable")
    assert "target copy" in finding(check).message and "not an MTP head" in finding(check).message
