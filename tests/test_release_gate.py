"""Issue 26, must hold: `report --fail-on error` never fails an unmodified official release for a reason
its publisher documents as intended, and always fails the broken quants in the fixtures.

Every fixture is in exactly one class below (a new fixture fails `test_every_fixture_is_classified`
until someone decides which), with the fixture's own notes (fixtures/*.py) as the evidence of what it
is. An official release may still fail the gate when an engine cannot draft it at all; those are listed
with the engine and the codes, and every such error is scoped to that engine (never a checkpoint-level
error, which would be a complaint about what the publisher shipped).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptinspect import api
from ckptinspect.api import gate
from conftest import run_cli
from fixtures.generate import FIXTURES

# Publishers' releases as shipped (or their exact layout in miniature) and fixed exports: the gate passes.
PASSES = (
    "qwen3_5_moe_nvfp4", "qwen3_5_moe_nvfp4_fused", "qwen3_5_moe_ct_nvfp4", "qwen3_5_dense_bf16", "qwen3_next_bf16",
    "qwen3_moe_bf16", "qwen3_dense_bf16", "deepseek_v3_fp8", "deepseek_v3_nvfp4", "deepseek_v32_fp8", "deepseek_v3_mixed",
    "kimi_k2", "kimi_k2_5", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm4_moe_fp8_mtp_head_quantized", "glm5_flash",
    "glm_ocr", "mimo_7b", "mimo_v2_flash", "ernie4_5_moe", "longcat_flash", "step3p5", "step3p7_vl", "nemotron_h",
    "nemotron_h_puzzle", "nemotron_h_omni", "bailing_moe", "bailing_moe_v3", "minimax_m2", "gpt_oss_mxfp4",
    "llama_bf16", "deepseek_v4_flash", "deepseek_v4_flash_base", "qwen4_exp", "intern_s2_preview",
    "interns2_mobius", "hy_v3", "hy_v4", "exaone_moe", "dots3_note", "inkling", "gemma4",
    # DeepSeek-V4 DSpark releases: the mtp.* stages are a DSpark draft both engines run (--speculative-algorithm DSPARK)
    "deepseek_v4_flash_dspark", "deepseek_v41_dspark",
    # issue 31's real layouts, answered by each engine's own per-module reading (readiness/engine_crosscheck.py):
    # nvidia DeepSeek-V4-Flash-NVFP4 (ignore list the hybrid paths do not read), Qwen3.8 FP8 (modules_to_not_convert
    # built as stored), NVIDIA Nemotron-3.5-Lightning NVFP4
    "deepseek_v4_nvidia_nvfp4", "qwen3_8_fp8_mtp_mixed", "nemotron3_5_lightning_nvfp4",
    # fixed third-party exports: what the broken ones below should have been
    "qwen3_5_moe_mtp_fc_excluded", "qwen3_5_moe_ct_nvfp4_mtp_ignored_per_projection",
    # exports whose MTP layer mixes schemes module by module, which both engines build as stored: nvidia's
    # MIXED_PRECISION pattern with FP8_BLOCK_SCALES MTP experts (vLLM >= 0.32 Fp8MoEMethod, SGLang's
    # ModelOptMixedPrecisionConfig per entry: tests/test_failure_modes.py test_d; vLLM 0.31 cannot), and a
    # weight-only NVFP4A16 export with NVFP4 MTP experts (SGLang 0.5.23's own loader loads every MTP tensor:
    # tests/test_verify.py; vLLM drafts it 4-bit, a warning). The rule that failed them ("SGLang builds one
    # scheme for the whole draft") generalized one PR's Quark MXFP4 path to every quantization method.
    "qwen3_5_moe_mixed_mtp_experts_fp8_block", "qwen3_5_moe_ct_nvfp4a16_mtp_experts",
)

# Official releases one or both engines cannot draft: engine -> the error codes that engine's findings carry.
# arch-unknown-to-engine: the engine version registers no model class for the target at all
# (rules/engines/architectures.yaml, read from the engine's registry; ckptinspect/readiness/engine_archs.py).
ENGINE_CANNOT = {
    "qwen3_5_moe_gptq_int4_bf16_mtp": {"sglang": {"mtp-bf16-not-excluded"}},  # fused MoE built gptq in SGLang
    "kimi_k3": {"sglang": {"engine-has-no-draft-model"}},
    "minimax_m3_vl": {"sglang": {"engine-has-no-draft-model"}},
    "minimax_m3_text": {"sglang": {"engine-has-no-draft-model"}},
    "exaone4_5": {"sglang": {"engine-has-no-draft-model"}},
    "pangu_ultra_moe": {"sglang": {"arch-unknown-to-engine"}},
    "mimo_v2_omni": {"sglang": {"engine-has-no-draft-model"}},
    "longcat_flash_ngram": {"sglang": {"arch-unknown-to-engine"}},
    # hybrid FP8 + NVFP4 export keeping the MTP experts MXFP4: SGLang's dedicated loader path reads them,
    # vLLM 0.33 builds them NVFP4 (rules/families/deepseek_v4.yaml)
    "deepseek_v4_hybrid_nvfp4": {"vllm": {"mtp-hybrid-mxfp4-experts-built-nvfp4"}},
    # ModelSlim W8A8 exports (sgl-project/sglang#37736, #34353 layouts): vLLM core has no modelslim method;
    # SGLang builds an int8 draft unquantized unless --speculative-draft-model-quantization is set
    "qwen3_5_dense_modelslim_w8a8": {"sglang": {"mtp-modelslim-draft-unquantized"},
                                     "vllm": {"quant-method-unknown-to-engine"}},
    "qwen3_5_dense_modelslim_w8a8_mtp_float": {"vllm": {"quant-method-unknown-to-engine"}},
    "deepseek_v41": {e: {"mtp-missing-tensors", "engine-has-no-draft-model"} for e in ("sglang", "vllm")},
    # vLLM-only drafts (fixtures/families_2026_d.py): SGLang 0.5.23 has no Step-5 model
    "step5": {"sglang": {"arch-unknown-to-engine"}},
    "nemotron_parse35": {"sglang": {"arch-unknown-to-engine"}},
    # vLLM 0.34.0's Nemotron-3.5-Transcribe MTP head (fixtures/families_2026_e.py): SGLang 0.5.23 has no such model
    "nemotron3_5_transcribe": {"sglang": {"arch-unknown-to-engine"}},
    "nemotron3_5_transcribe_fp8": {"sglang": {"arch-unknown-to-engine"}},
    "nemotron3_5_transcribe_nvfp4": {"sglang": {"arch-unknown-to-engine"}},
}

# Quants and exports that dropped, re-keyed, truncated or mis-declared the MTP layer: the gate fails.
BROKEN_QUANTS = (
    "qwen3_5_moe_nvfp4_nomtp", "qwen3_5_moe_mtp_partial_quant", "qwen3_5_moe_mtp_incomplete",
    "qwen3_5_moe_mtp_quantized_but_excluded",
    "qwen3_5_moe_mtp_nvfp4_no_global_scale", "deepseek_v3_nvfp4_nomtp",
    "deepseek_v3_nvfp4_mtp_fp4", "deepseek_v3_depth_mismatch", "deepseek_v3_ct_nvfp4_eh_proj_quantized",
    "deepseek_v3_nvfp4_mtp_experts_mxfp4", "deepseek_v3_ct_fp8_mtp_ignored_at_3", "deepseek_v4_flash_nomtp",
    "deepseek_v4_flash_mtp_incomplete", "glm5_flash_nvfp4_mtp_fp4", "hy_v3_nomtp", "hy_v4_at_layer_l",
    "inkling_nomtp", "gigachat35_nomtp", "iquest_q1_mtp_nomtp", "deepseek_v4_hybrid_nvfp4_mtp_nvfp4",
    "step5_nomtp", "nemotron_parse35_nomtp", "step5_mtp_no_head", "nemotron3_5_transcribe_nomtp",
    "minimax_m3_dspark_no_markov", "mistral_large4_no_mask", "mistral_large4_nodraft",
)

# Files a reader must refuse: the report itself is an error (exit 2), so any gate fails.
BROKEN_FILES = tuple(name for name, spec in FIXTURES.items()
                     if name.startswith("broken_") or (spec.breaker and spec.breaker != "with_pickle"))

# Not a release nor a quant of one: no gate claim.
OTHER = {
    "llama_awq": "generic AWQ layout, no named release", "llama_gptq": "generic GPTQ layout, no named release",
    "with_pickle": "a valid checkpoint next to a stray pytorch_model.bin (the pickle test)",
    "deepseek_v4_flash_nvfp4": "a community-style NVFP4 conversion", "unknown_mtp_top": "unknown architecture",
    "unknown_model_mtp": "unknown architecture", "unknown_layers_l": "unknown architecture",
    "gigachat35": "built from SGLang's config class (no public config.json)",
    "gemma4_assistant": "built from SGLang's model class (no public config.json)",
    "iquest_q1": "built from SGLang's config class (no public config.json)",
    "iquest_q1_mtp": "built from SGLang's config class (no public config.json)",
    "minimax_m3_dspark": "released dspark/ layout from a public port's schema test, its ignored_layers modelled",
    # the config vLLM 0.34.0 reads with KimiK3Config: neither engine can draft it (tests/test_families_2026_e.py)
    "kimi_k31": "built from vLLM's config class (no public config.json)",
    # params.json as vLLM 0.34.0's adapter reads it; SGLang has no model (tests/test_mistral_large4.py)
    "mistral_large4": "built from vLLM's params.json adapter (no public params.json)",
}


def test_every_fixture_is_classified():
    classes = [set(PASSES), set(ENGINE_CANNOT), set(BROKEN_QUANTS), set(BROKEN_FILES), set(OTHER)]
    assert sum(len(c) for c in classes) == len(set().union(*classes)), "a fixture is in two classes"
    assert set().union(*classes) == set(FIXTURES)


@pytest.mark.parametrize("name", PASSES)
def test_an_official_release_or_fixed_export_passes_fail_on_error(name, report):
    assert gate(report(name), "error") == []


@pytest.mark.parametrize("name", sorted(ENGINE_CANNOT))
def test_an_official_release_fails_only_for_an_engine_that_cannot_draft_it(name, report):
    r = report(name)
    assert not [f.code for f in r.checkpoint.findings if f.severity == "error"]  # nothing the publisher did
    errors = [f for f in r.mtp.findings if f.severity == "error"]
    by_engine: dict[str, set[str]] = {}
    for f in errors:
        by_engine.setdefault(f.engine, set()).add(f.code)
    assert by_engine == ENGINE_CANNOT[name]
    assert all(r.mtp.verdicts[e].verdict == "unusable" for e in by_engine)  # the error and the verdict agree


@pytest.mark.parametrize("name", BROKEN_QUANTS)
def test_a_broken_quant_fails_fail_on_error(name, report):
    assert gate(report(name), "error"), name


def test_the_cli_gate_on_each_class(make_fixture):
    """The exit codes a CI job sees: 0 official, 1 broken quant, 2 unreadable files."""
    for name, code in (("minimax_m2", 0), ("qwen3_5_moe_nvfp4", 0), ("qwen3_5_moe_mtp_quantized_but_excluded", 1),
                       ("deepseek_v3_nvfp4_nomtp", 1), ("broken_truncated_header", 2), ("broken_index_escape", 2)):
        res = run_cli("report", str(make_fixture(name)), "--fail-on", "error", "-q")
        assert res.returncode == code, (name, res.returncode, res.stderr[-300:])


@pytest.mark.parametrize("name", BROKEN_FILES)
def test_a_broken_file_is_an_error_before_any_gate(name, make_fixture):
    from ckptinspect import api
    from ckptinspect.errors import CkptInspectError

    with pytest.raises(CkptInspectError):
        api.inspect(str(make_fixture(name)))


# MiniMax-M3 releases ship their DSpark draft in dspark/ (rules: minimax_m3 draft_subfolders), which both engines
# load from there themselves: the gate judges that draft too. A broken one (tensors missing; a config of another
# family, which neither engine builds as the DSpark draft: rules/families/minimax_m3_dspark.yaml) fails the gate
# for the draft, where the target alone would pass (vLLM: the target's MTP verdict is ready).
def _unknown_family(draft: Path) -> None:
    config = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    config.update(architectures=["SomeOtherDraftModel"], model_type="some_other_draft")
    (draft / "config.json").write_text(json.dumps(config), encoding="utf-8")


DSPARK_DRAFTS = {"as released": ("minimax_m3_dspark", None),
                 "markov head missing": ("minimax_m3_dspark_no_markov", None),
                 "config of another family": ("minimax_m3_dspark", _unknown_family)}


@pytest.fixture()
def with_dspark(make_fixture, tmp_path):
    def build(case: str) -> Path:
        draft, mutate = DSPARK_DRAFTS[case]
        root = tmp_path / case.replace(" ", "-")
        shutil.copytree(make_fixture("minimax_m3_vl"), root)
        shutil.copytree(make_fixture(draft), root / "dspark")
        if mutate is not None:
            mutate(root / "dspark")
        return root
    return build


@pytest.mark.parametrize("case", sorted(DSPARK_DRAFTS))
def test_the_gate_judges_the_draft_subfolder_a_release_ships(case, with_dspark):
    from ckptinspect.audit.row import gate as row_gate, row_from_report
    from ckptinspect.pipeline import build_report
    from ckptinspect.render.json_out import report_to_json

    root = with_dspark(case)
    r = build_report(str(root), progress=False)
    assert r.mtp.verdicts["vllm"].verdict == "ready"  # the target alone passes for vLLM
    broken = case != "as released"
    draft_trips = {"unusable": ["dspark/ vllm=unusable"] if broken else [],
                   "error": [t for t in gate(r, "error") if t.endswith("(dspark/)")]}
    assert gate(r, "unusable", "vllm") == draft_trips["unusable"]
    assert gate(r, "degraded", "vllm") == draft_trips["unusable"]
    assert bool(draft_trips["error"]) is broken, gate(r, "error")
    # the audit's gate reads the same document and trips the same way
    row = row_from_report("MiniMaxAI/MiniMax-M3", report_to_json(r))
    for fail_on in ("unusable", "error"):
        assert row_gate(row, fail_on, "vllm") == gate(r, fail_on, "vllm"), fail_on
    # and so does the CLI a release pipeline runs
    res = run_cli("report", str(root), "--fail-on", "unusable", "--engine", "vllm", "-q")
    assert res.returncode == (1 if broken else 0), res.stderr[-300:]
    if broken:
        assert "dspark/ vllm=unusable" in res.stderr


def test_a_target_without_the_draft_subfolder_is_not_gated_on_it(make_fixture):
    """No dspark/: the target serves without the draft (the engines raise only when asked for DSpark; info
    findings say so), so the gate is the target's alone."""
    r = api.inspect(str(make_fixture("minimax_m3_vl")))
    assert r.drafts[0].status == "absent" and r.drafts[0].verdicts["vllm"].verdict == "unusable"
    assert gate(r, "unusable", "vllm") == [] and not [t for t in gate(r, "error") if "dspark/" in t]
