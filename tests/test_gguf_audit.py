"""Issue 34 §3: GGUF where the other formats go. `audit --gpu` on a GGUF repo gives a fit from the
llama.cpp plan (main: every GGUF repo was an error row, "--tp / --gpu describe SGLang / vLLM
deployments"), and a repo of several GGUF quants (the usual Hub layout) is one row per quant (main: an
error row unless each quant was named with :TAG). Run as the CLI against tests/hub_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from hub_server import HubServer

pytest.importorskip("gguf")

from fixtures.gguf_models import MODELS, write_model  # noqa: E402


@pytest.fixture(scope="module")
def quants(tmp_path_factory) -> Path:
    """One repo of three quants (one split into parts, one with its MTP head in a companion file)."""
    root = tmp_path_factory.mktemp("gguf_audit") / "repo"
    write_model(MODELS["GLM-4.5-Air-Q4_K_M"], root)
    write_model(MODELS["GLM-4.5-Air-Q8_0"], root / "Q8_0")
    write_model(replace(MODELS["GLM-4.5-Air-trunk-Q4_K_M"], name="GLM-4.5-Air-trunk-IQ4_XS"), root / "trunk")
    return root


def _env(tmp_path: Path, endpoint: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CKPTINSPECT_"))}
    return {**env, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint, "PYTHONPATH": str(ROOT),
            "CKPTINSPECT_CACHE_DIR": str(tmp_path / "cache")}


def _audit(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptinspect", "audit", *args], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=300)


def test_a_repo_of_several_quants_is_a_row_per_quant_with_a_llamacpp_fit(quants, tmp_path) -> None:
    from ckptinspect.render.audit_out import validate_audit_json

    with HubServer() as server:
        server.add_repo("org/GLM-4.5-Air-GGUF", quants)
        env = _env(tmp_path, server.url)
        done = _audit(env, "org/GLM-4.5-Air-GGUF", "--gpu", "h200", "--gpus", "1", "--format", "json", "--quiet")
        text = _audit(env, "org/GLM-4.5-Air-GGUF", "--gpu", "h200", "--gpus", "1", "--quiet", "--wide")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    validate_audit_json(doc)
    rows = {row["repo"]: row for row in doc["rows"]}
    assert set(rows) == {"org/GLM-4.5-Air-GGUF:GLM-4.5-Air-Q4_K_M", "org/GLM-4.5-Air-GGUF:GLM-4.5-Air-Q8_0",
                         "org/GLM-4.5-Air-GGUF:GLM-4.5-Air-trunk-IQ4_XS"}, done.stdout
    for repo, row in rows.items():
        assert row["status"] == "ok", row
        fit = row["fit"]
        assert fit["fits"] is True and fit["gpu"] == "H200-SXM" and fit["gpus"] == 1, fit
        assert list(row["verdict"]) == ["llamacpp"] and row["format"] == "gguf"
    # the companion head (mtp-*.gguf next to the trunk) is counted: the trunk quant is READY, as `report` says
    assert rows["org/GLM-4.5-Air-GGUF:GLM-4.5-Air-trunk-IQ4_XS"]["verdict"]["llamacpp"] == "ready"
    assert text.returncode == 0, text.stderr
    assert "GgufQuantChoice" not in text.stdout and "describe SGLang" not in text.stdout
    assert text.stdout.count("yes, 1 used") == 3


def test_report_gpu_on_a_gguf_is_the_llamacpp_plan(quants) -> None:
    done = run_cli("report", f"{quants}:Q4_K_M", "--gpu", "h200", "--gpus", "1", "--format", "json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plan"]
    assert plan["engine"] == "llamacpp" and plan["gpu_layers"] == plan["total_layers"]
    tp = run_cli("report", f"{quants}:Q4_K_M", "--tp", "2")
    assert tp.returncode == 2 and "llama.cpp" in tp.stderr
