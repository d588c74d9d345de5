"""The per-module table (declared / stored / built per engine) on every fixture: it agrees with the
verdicts, renders in text / markdown / JSON, and no error finding names an MTP module that every
engine builds as stored (issue 20, must hold)."""

from __future__ import annotations

import re

import pytest

from ckptinspect.render.json_out import report_to_json, validate_report_json
from ckptinspect.render.text import render_markdown, render_text
from fixtures.generate import FIXTURES

MTP_FIXTURES = [name for name, spec in FIXTURES.items() if getattr(spec, "mtp_tensors", 0)]


def _row_for(rows, subject):
    for row in rows:
        pattern = "^" + re.escape(row.module).replace(r"\{\}", r"\d+") + r"(\.|$)"
        if re.match(pattern, subject):
            return row
    return None


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_table_agrees_with_verdicts_and_findings(report, name):
    r = report(name)
    mtp = r.mtp
    if not mtp.present_layers:
        assert mtp.modules == ()
        return
    assert mtp.modules, name
    for engine, verdict in mtp.verdicts.items():
        if verdict.draft_architecture is None:
            assert {m.built[engine] for m in mtp.modules} == {"no draft model"}
            continue
        answers = dict(verdict.module_quantization)
        for row in mtp.modules:
            if row.built[engine] not in ("load error", "not buildable"):  # no per-module answer then
                # "(not decided)": the generic reading of the declared lists, flagged (module_table._not_decided)
                built = row.built[engine].removesuffix(" (not decided)")
                assert (built != "unquantized") == (answers.get(row.module) is not None), (engine, row)
        # a module that does not fit what is stored never leaves the verdict "ready" (a vocabulary head
        # excepted: SGLang's NextN loaders skip shared_head.head and share the target's lm_head,
        # rules/families/_mtp_common.yaml mtp-plain-linear-quantized)
        if any(not m.matches[engine] and m.reasons[engine] != "head" for m in mtp.modules):
            assert verdict.verdict != "ready", (engine, [m for m in mtp.modules if not m.matches[engine]])
    for finding in (*r.checkpoint.findings, *mtp.findings):
        if finding.severity != "error" or not finding.subject:
            continue
        row = _row_for(mtp.modules, finding.subject)
        if row is not None:
            assert not all(row.matches.values()), (finding.code, finding.message, row)


def test_no_table_when_every_module_fits(report):
    r = report("qwen3_5_moe_nvfp4")
    assert r.mtp.modules and all(all(m.matches.values()) for m in r.mtp.modules)
    assert "MTP modules (" not in render_text(r)


def test_rendered_in_text_markdown_and_json(report):
    r = report("qwen3_5_moe_mtp_quantized_but_excluded")
    text, markdown = render_text(r), render_markdown(r)
    assert "MTP modules (! = built unlike stored)" in text and "## MTP modules" in markdown
    assert "mtp.fc " not in text.split("MTP modules")[1].split("Findings")[0]  # fits everywhere: JSON only
    assert re.search(r"mtp\.layers\.0\.mlp\.experts\.\{\}\.gate_proj +excluded +nvfp4 +unquantized \(!\)", text)
    doc = report_to_json(r)
    validate_report_json(doc)
    row = next(m for m in doc["mtp"]["modules"] if m["module"] == "mtp.layers.0.mlp.experts.{}.gate_proj")
    assert row["declared"] == "excluded" and row["stored"] == "nvfp4"
    # vLLM's answer comes from rules/quant/vllm.yaml: the cause names the entry responsible
    assert row["engines"]["vllm"] == {"built": "unquantized", "reason": "excluded",
                                      "cause": "hf_quant_config.json:quantization.exclude_modules entry 'mtp*' "
                                               "(full name, substring or fnmatch)", "matches_stored": False}
