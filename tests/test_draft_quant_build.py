"""The engine decision procedures (rules/quant/sglang.yaml) inside the readiness
verdicts: per MTP module, what SGLang builds, why, and the finding when its config raises."""

from __future__ import annotations

import json

from ckptinspect.pipeline import build_report
from toy_inputs import copy_with_config


def _ct(cfg):
    return cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]


def test_ct_mtp_in_neither_targets_nor_ignore_is_a_load_error(make_fixture, tmp_path):
    """sgl-project/sglang#38574: SGLang raises 'Unable to find matching target' for a module that no
    config_groups target and no ignore entry names (tests/test_draft_quant_sglang.py shows SGLang's own
    class doing so)."""
    def edit(cfg):
        qc = _ct(cfg)
        qc["ignore"] = [e for e in qc["ignore"] if "mtp" not in e]
        for group in qc["config_groups"].values():
            group["targets"] = [r"re:model\.layers\..*", r"re:model\.language_model\..*"]
    src = make_fixture("qwen3_5_moe_ct_nvfp4")
    r = build_report(str(copy_with_config(src, tmp_path / "ct", edit)), progress=False)
    sg = r.mtp.verdicts["sglang"]
    assert sg.verdict == "unusable" and "mtp-module-load-error" in sg.reasons
    finding = next(f for f in r.mtp.findings if f.code == "mtp-module-load-error")
    assert finding.severity == "error" and "Unable to find matching target for mtp." in finding.message
    assert finding.hint and "ignore" in finding.hint


def test_ct_mtp_ignored_by_regex_stays_ready(report):
    """The unmodified fixture ignores `re:mtp.*`: SGLang builds every MTP module unquantized, as stored."""
    r = report("qwen3_5_moe_ct_nvfp4")
    sg = r.mtp.verdicts["sglang"]
    assert sg.verdict == "ready", sg.reasons
    assert all(built is None for _, built in sg.module_quantization)
    assert not [f for f in r.mtp.findings if f.severity == "error"]


def test_fp8_ignore_key_is_reported_not_applied():
    """SGLang's Fp8Config reads no `ignore` key (tests/test_draft_quant_sglang.py asks it): the list
    excludes nothing, and a checkpoint relying on it gets a warning instead of a false exclusion."""
    from ckptinspect.quant.declared import is_excluded, read_declared

    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "ignore": ["mtp.fc"], "modules_to_not_convert": ["lm_head"]}
    declared, findings = read_declared({"quantization_config": qc}, None)
    assert is_excluded(declared, "mtp.fc") is False and is_excluded(declared, "lm_head") is True
    finding = next(f for f in findings if f.code == "fp8-ignore-not-read")
    assert finding.severity == "warning" and "1 module(s)" in finding.message


def test_vision_tower_outside_the_lists_is_info_not_a_warning(make_fixture, tmp_path):
    """Issue 26 item 5: vision-tower modules outside `targets: ["Linear"]`'s ignore list are not a
    load failure in SGLang (its Qwen3-VL / Qwen3.5 towers take no quant config), so no warning."""
    def edit(cfg):
        qc = _ct(cfg)
        qc["ignore"] = [e for e in qc["ignore"] if "visual" not in e]
    src = make_fixture("qwen3_5_moe_ct_nvfp4")
    r = build_report(str(copy_with_config(src, tmp_path / "vis", edit)), progress=False)
    vision = [f for f in r.checkpoint.findings if f.subject and ".visual." in f.subject]
    assert vision, [f.code for f in r.checkpoint.findings]
    assert {(f.code, f.severity) for f in vision} == {("vision-not-excluded", "info")}
    assert "SGLang" in vision[0].message


def test_quantized_but_excluded_names_the_entry_sglang_matches(make_fixture, tmp_path):
    """ModelOpt's is_layer_excluded also matches one dotted part: an `experts` entry excludes the
    FP8-block MTP experts in SGLang (tests/test_draft_quant_sglang.py shows its class doing so), and the
    finding names the entry responsible."""
    import json

    dst = copy_with_config(make_fixture("qwen3_5_moe_mixed_mtp_experts_fp8_block"), tmp_path / "mixed", None)
    hq_path = dst / "hf_quant_config.json"
    hq = json.loads(hq_path.read_text())
    hq["quantization"]["exclude_modules"] = [*hq["quantization"].get("exclude_modules", []), "experts"]
    hq_path.write_text(json.dumps(hq))
    r = build_report(str(dst), progress=False)
    row = next(m for m in r.mtp.modules if m.component == "routed_expert")
    assert row.stored.startswith("fp8")  # the tiny fixture's 128x128 tiles cover each expert whole
    assert row.built["sglang"] == "unquantized" and "'experts'" in row.causes["sglang"]
    assert not row.matches["sglang"]
    finding = next(f for f in r.mtp.findings if f.code == "mtp-quantized-but-excluded" and f.engine == "sglang")
    assert finding.severity == "error" and "'experts'" in finding.message
