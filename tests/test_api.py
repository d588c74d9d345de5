"""The library API (ckptinspect.api) is what the CLI runs: same documents, same gates, same refusals."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from ckptinspect import api
from ckptinspect.errors import NotFoundError, RuleError
from ckptinspect.render.report import render_report


@pytest.mark.parametrize("name", ["qwen3_5_moe_nvfp4", "deepseek_v3_fp8", "gpt_oss_mxfp4"])
def test_inspect_renders_exactly_what_the_cli_prints(name, make_fixture):
    path = str(make_fixture(name))
    report = api.inspect(path)
    for fmt in ("json", "markdown"):
        assert render_report(report, fmt) == run_cli("report", path, "--format", fmt).stdout, fmt
    assert render_report(report, "text") == run_cli("report", path, "--wide").stdout


@pytest.mark.parametrize("name, expected", [("qwen3_5_moe_nvfp4_nomtp", ["sglang=unusable", "vllm=unusable"]),
                                            ("qwen3_5_moe_mtp_partial_quant", ["sglang=unusable"]),
                                            ("qwen3_5_moe_nvfp4", [])])
def test_gate_agrees_with_the_cli_exit_code(name, expected, make_fixture):
    path = str(make_fixture(name))
    assert api.gate(api.inspect(path), "unusable") == expected
    res = run_cli("report", path, "--fail-on", "unusable", "--format", "json")
    assert res.returncode == (1 if expected else 0)
    if expected:
        assert res.stderr.strip() == f"fail-on unusable: MTP verdict {', '.join(expected)}"


def test_only_none_means_the_bundled_example(tmp_path):
    from ckptinspect.examples import EXAMPLE_DIR

    # the same directory (the bare command names it relative to the current directory when below it)
    bare = Path(api.inspect().checkpoint.location)
    assert bare.resolve() == Path(api.inspect(str(EXAMPLE_DIR)).checkpoint.location).resolve() == EXAMPLE_DIR
    assert not bare.is_absolute() if EXAMPLE_DIR.is_relative_to(Path.cwd().resolve()) else bare == EXAMPLE_DIR
    for bad in ("", "  "):
        with pytest.raises(NotFoundError, match="empty model reference"):
            api.inspect(bad)
    with pytest.raises(NotFoundError, match=f"pass the directory instead: {EXAMPLE_DIR}$"):
        api.inspect(str(EXAMPLE_DIR / "config.json"))
    other = tmp_path / "notes.json"
    other.write_text("{}")
    from ckptinspect.errors import CkptInspectError

    with pytest.raises(CkptInspectError) as info:  # a stray .json is still read as a (bad) snapshot
        api.inspect(str(other))
    assert "model directory" not in str(info.value)


def test_snapshot_round_trip_through_the_api(make_fixture, tmp_path):
    path = str(make_fixture("deepseek_v3_fp8"))
    out = tmp_path / "ds.json.gz"
    raw = api.snapshot(path, out)
    assert out.is_file() and len(raw.headers) == 5
    direct, saved = (json.loads(render_report(api.inspect(ref), "json")) for ref in (path, str(out)))
    direct.pop("source"), saved.pop("source")
    assert direct == saved


def test_diff_gate_levels(make_fixture):
    d = api.diff(str(make_fixture("qwen3_5_moe_nvfp4")), str(make_fixture("qwen3_5_moe_nvfp4_nomtp")))
    # the dropped layer, and each engine whose verdict got worse (issue 26 item 1); B's own readiness
    # errors are not repeated when B has no MTP layer at all
    assert api.diff_gate(d, "error") == ["mtp-dropped (error)"] + ["mtp-verdict-worse (error)"] * 2
    assert api.diff_gate(d, "warning")[0] == "mtp-dropped (error)"
    same = api.diff(str(make_fixture("deepseek_v3_fp8")), str(make_fixture("deepseek_v3_fp8")))
    assert api.diff_gate(same, "warning") == []


def test_records_are_plain_data():
    from ckptinspect import diff, records

    for module in (records, diff):
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                assert not hasattr(cls, "to_json"), f"{module.__name__}.{cls.__name__} renders itself"


def test_import_is_light_and_inspect_is_lazy():
    code = ("import sys, ckptinspect; assert 'ckptinspect.pipeline' not in sys.modules; "
            "r = ckptinspect.inspect(); assert r.mtp.verdicts['sglang'].verdict == 'ready'; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT))
    assert res.stdout.strip() == "ok", res.stderr


@pytest.mark.parametrize("name", ["qwen3_5_moe_mtp_incomplete", "qwen3_5_moe_nvfp4_nomtp", "qwen3_5_moe_nvfp4"])
def test_error_gate_is_every_error_finding_of_the_document(name, make_fixture):
    report = api.inspect(str(make_fixture(name)))
    doc = json.loads(render_report(report, "json"))
    assert api.gate(report, "error") == [f["code"] for f in doc["findings"] if f["severity"] == "error"]


def test_rule_listing_api_is_what_the_cli_prints(cli):
    concrete, everything = api.list_rules(), api.list_rules(include_abstract=True)
    listed = json.loads(cli("rules", "list", "--all", "--format", "json").stdout)["families"]
    assert [f["id"] for f in listed] == [f.id for f in everything]
    assert {f.id for f in everything} - {f.id for f in concrete} == {f["id"] for f in listed if f["abstract"]}
    assert api.family_rule("deepseek_v3").id == "deepseek_v3"
    with pytest.raises(RuleError, match="unknown family 'deepseek_v9'.*deepseek_v3"):
        api.family_rule("deepseek_v9")


def test_validate_rules_names_each_bad_file_and_passes_good_ones(tmp_path):
    from ckptinspect.rules.documents import rules_root

    good = rules_root() / "gpus.yaml"
    bad = tmp_path / "gpus.yaml"
    bad.write_text(good.read_text(encoding="utf-8").replace("memory_gib: 80", "memory_gib: -80", 1))
    checks = api.validate_rules([good, bad])
    assert [c.path for c in checks] == [str(good), str(bad)]
    assert checks[0].error is None
    assert checks[1].error.startswith(f"{bad}: $.gpus[0].memory_gib")


def test_validate_rules_takes_a_directory_of_engine_files_and_reports_a_bad_family_once(tmp_path):
    from ckptinspect.rules.documents import rules_root

    engines = [c for c in api.validate_rules([rules_root() / "engines"])]
    assert sorted(Path(c.path).name for c in engines) == ["architectures.yaml", "common.yaml", "llamacpp.yaml", "sglang.yaml", "vllm.yaml"]
    assert all(c.error is None for c in engines)
    broken = tmp_path / "fams"
    broken.mkdir()
    (broken / "bad.yaml").write_text("id: [unclosed\n")
    checks = api.validate_rules([broken])
    assert len(checks) == 1 and checks[0].error is not None and "bad.yaml" in checks[0].error
