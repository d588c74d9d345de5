"""Issue 20 item 4 and issue 26 item 5: "config declares MTP, the files do not" is its own
checkpoint-level error finding with the count; MiniMax-M2's official releases, whose publisher
documents that no MTP weights are published, get a distinct warning code instead, so
`--fail-on error` passes them while broken quants still fail it."""

from __future__ import annotations

from ckptinspect.api import gate


def _codes(report, severity=None):
    r = report
    return {f.code for f in (*r.checkpoint.findings, *(r.mtp.findings if r.mtp else ()))
            if severity is None or f.severity == severity}


def test_declared_not_shipped_is_an_error_with_the_count(report):
    r = report("qwen3_5_moe_nvfp4_nomtp")
    finding = next(f for f in r.mtp.findings if f.code == "mtp-declared-not-shipped")
    declared = r.mtp.declared_layers
    assert finding.severity == "error" and f"0 of {declared}" in finding.message
    assert "text_config.mtp_num_hidden_layers" in finding.message
    assert "mtp-declared-not-shipped" in gate(r, "error")
    assert "mtp-declared-not-published" not in _codes(r)


def test_minimax_official_release_passes_fail_on_error(report):
    r = report("minimax_m2")
    assert r.mtp.declared_layers == 3 and r.mtp.present_layers == 0
    codes = _codes(r)
    assert "mtp-declared-not-published" in codes
    assert not {"mtp-declared-not-shipped", "mtp-declared-but-absent"} & codes
    assert {f.severity for f in r.mtp.findings if f.code == "mtp-declared-not-published"} == {"warning"}
    assert gate(r, "error") == [], gate(r, "error")
    # The draft still cannot run: the verdict gate refuses it.
    assert set(gate(r, "unusable")) == {"sglang=unusable", "vllm=unusable"}


def test_broken_quant_still_fails_fail_on_error(report):
    # quantized MTP modules that the declaration excludes: the engines cannot load them
    r = report("qwen3_5_moe_mtp_quantized_but_excluded")
    assert r.mtp.present_layers >= 1 and gate(r, "error")
    assert "mtp-declared-not-published" not in _codes(r)
