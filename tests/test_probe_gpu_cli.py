"""Issue 33 item 1: every probe mode from a fresh process on a GPU, through the CLI, as a user runs
it (no CUDA call may come before CUDA is initialised: a streamed run once failed at
``torch.cuda.reset_peak_memory_stats`` in a fresh process while the same call passed in-process
after other GPU work). Skips without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from probe_helpers import ROOT, fixture, torch, write_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["What are three ways to water a garden?", "Write a Python function that adds two numbers.",
           "Solve for x: 3x + 7 = 2x - 5."]


def _probe(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "probe", *args, "--device", "cuda:0", "--format",
                           "json", "-q"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("extra", [("--mode", "greedy", "--max-new-tokens", "16"),
                                   ("--mode", "teacher"),
                                   ("--mode", "teacher", "--max-gpu-memory", "0.1"),
                                   ("--categories", "synthetic", "--synthetic-len", "64", "--max-new-tokens", "8")],
                         ids=["greedy", "teacher", "streamed", "synthetic"])
def test_each_mode_from_a_fresh_process(tmp_path, extra):
    prompts = write_prompts(tmp_path, PROMPTS)
    args = [fixture("qwen35moe_nvfp4"), "--steps", "2", *extra]
    if "synthetic" not in extra:
        args += ["--prompts", prompts]
    doc = _probe(*args)
    assert doc["overall"]["depths"][0]["scored"] > 0
    if "--max-gpu-memory" in extra:
        info = doc["streaming"]
        assert doc["main_model"]["source"] == "layer-streamed transformers"
        assert 0 < info["peak_bytes"] <= info["limit_bytes"]
        assert info["read_ahead"] is True and len(info["per_layer"]) == info["layers"]
    else:
        assert doc["main_model"]["source"] == "in-process transformers"
        assert doc["peak_bytes_by_phase"]
