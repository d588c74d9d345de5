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
