"""Drafts in a subfolder of the target checkpoint, declared by the family's rule (``draft_subfolders``):
MiniMax-M3's DSpark draft in ``dspark/``, which vLLM 0.34.0 (method dspark: VL:v1/worker/gpu/spec_decode/dspark/
config.py:36-45 -> VL:config/speculative.py:133-157) and SGLang 0.5.23 (--speculative-algorithm DSPARK:
SG:arg_groups/speculative_hook.py:622-755) resolve from ``<model>/dspark`` themselves.

`report` on the target reads dspark/config.json and the dspark/ headers (same readers; from the Hub, from the
repo's one file listing over the same client) and judges them with minimax_m3_dspark; the same report comes
from a local directory, the Hub and the HF cache. Without dspark/ the draft is absent and both engines raise.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.pipeline import build_report  # noqa: E402
from ckptinspect.readiness import load_rules  # noqa: E402
from ckptinspect.render.json_out import report_to_json, validate_report_json  # noqa: E402
from ckptinspect.settings import Settings  # noqa: E402

REPO = "MiniMaxAI/MiniMax-M3-tiny"


@pytest.fixture()
def target_with_draft(make_fixture, tmp_path) -> Path:
    """The MiniMax-M3 VL target fixture with the DSpark draft fixture as its dspark/ subfolder."""
    root = tmp_path / "MiniMax-M3"
    shutil.copytree(make_fixture("minimax_m3_vl"), root)
    shutil.copytree(make_fixture("minimax_m3_dspark"), root / "dspark")
    return root


def _draft_facts(report) -> dict:
    (draft,) = report.drafts
    out = {"subfolder": draft.subfolder, "status": draft.status, "family": draft.family,
           "verdicts": {e: (v.verdict, v.draft_architecture, v.method, v.draft_quantization, v.reasons)
                        for e, v in draft.verdicts.items()},
           "findings": sorted((f.code, f.engine) for f in draft.findings)}
    if draft.mtp is not None:
        out.update(tensors=draft.mtp.tensors, layers=(draft.mtp.declared_layers, draft.mtp.present_layers),
                   schemes=dict(draft.mtp.schemes), family_matched=draft.checkpoint.family,
                   headers={k: v for k, v in draft.checkpoint.inventory.totals.__dict__.items()})
    return out


def test_the_subfolder_is_rule_data():
    rules = load_rules()
    (sub,) = rules.get("minimax_m3").draft_subfolders
    assert (sub.path, sub.family) == ("dspark", "minimax_m3_dspark")
    assert "speculative.py:133-157" in sub.reference and "speculative_hook.py" in sub.reference
    assert sub.absent_rule("vllm", "0.34.0").code == "draft-subfolder-absent"
    assert sub.absent_rule("vllm", "0.33.0").code == "engine-has-no-draft-model"
    assert all(not f.draft_subfolders for f in rules.families if f.id != "minimax_m3")


def test_report_on_the_target_finds_the_dspark_draft(target_with_draft, fixture_specs):
    r = build_report(str(target_with_draft), progress=False)
    assert r.checkpoint.family == "minimax_m3"
    # the target's own MTP module is judged as before; the draft comes beside it
    assert r.mtp.family == "minimax_m3" and r.mtp.verdicts["vllm"].draft_architecture == "MiniMaxM3MTP"
    # the target's inventory holds only its own shards: dspark/ files are never counted in it
    assert all("/" not in s.name for s in r.checkpoint.inventory.shards)
    facts = _draft_facts(r)
    spec = fixture_specs["minimax_m3_dspark"]
    assert facts["status"] == "present" and facts["family_matched"] == "minimax_m3_dspark"
    assert facts["tensors"] == spec.mtp_tensors == len(spec.tensors)
    assert facts["layers"] == (2, 2)
    for engine, method in (("vllm", "dspark"), ("sglang", "DSPARK")):
        assert facts["verdicts"][engine][:4] == ("ready", "DSparkMiniMaxDraftModel", method, "mxfp8")
    # the draft family's "this is a draft, serve the target" check is not repeated on the target's report
    assert ("checkpoint-is-a-dspark-draft", None) not in facts["findings"]
    doc = report_to_json(r)
    validate_report_json(doc)
    (d,) = doc["mtp"]["drafts"]
    assert (d["subfolder"], d["status"], d["matched_family"]) == ("dspark", "present", "minimax_m3_dspark")
    assert d["mtp"]["tensors"] == facts["tensors"] and d["verdict"] == {"sglang": "ready", "vllm": "ready"}


def test_the_draft_is_judged_as_the_subfolder_alone_is(target_with_draft):
    whole = build_report(str(target_with_draft), progress=False).drafts[0]
    alone = build_report(str(target_with_draft / "dspark"), progress=False)
    assert whole.mtp.verdicts == alone.mtp.verdicts
    assert (whole.mtp.tensors, whole.mtp.schemes) == (alone.mtp.tensors, alone.mtp.schemes)


def test_vllm_before_0_34_cannot_draft_it(target_with_draft):
    r = build_report(str(target_with_draft), progress=False, engine_versions={"vllm": "0.33.0"})
    v = r.drafts[0].verdicts["vllm"]
    assert (v.verdict, v.reasons) == ("unusable", ("engine-has-no-draft-model",))


def test_target_without_the_subfolder_says_the_draft_is_absent(make_fixture):
    r = build_report(str(make_fixture("minimax_m3_vl")), progress=False)
    (draft,) = r.drafts
    assert (draft.subfolder, draft.status, draft.checkpoint) == ("dspark", "absent", None)
    v, s = draft.verdicts["vllm"], draft.verdicts["sglang"]
    assert (v.verdict, v.reasons, v.method) == ("unusable", ("draft-subfolder-absent",), "dspark")
    assert (s.verdict, s.reasons, s.method) == ("unusable", ("draft-subfolder-absent",), "DSPARK")
    messages = {f.engine: f.message for f in draft.findings}
    assert "raises ValueError" in messages["vllm"] and "dspark/config.json" in messages["vllm"]
    assert "--speculative-draft-model-path" in messages["sglang"]
    # info only: a target without the draft is served fine without --speculative-config dspark
    assert all(f.severity == "info" for f in draft.findings)
    old = build_report(str(make_fixture("minimax_m3_vl")), progress=False, engine_versions={"vllm": "0.32.0"})
    assert old.drafts[0].verdicts["vllm"].reasons == ("engine-has-no-draft-model",)
    validate_report_json(report_to_json(r))


def test_families_without_a_draft_subfolder_report_none(report):
    assert report("minimax_m3_dspark").drafts == () and report("qwen3_5_moe_nvfp4").drafts == ()


def test_text_report_names_the_draft_subfolder(target_with_draft):
    from ckptinspect.render.report import render_report

    text = render_report(build_report(str(target_with_draft), progress=False), "text", width=120)
    assert "MTP draft subfolder dspark/ (minimax_m3_dspark)" in text
    assert "DSparkMiniMaxDraftModel" in text


@pytest.fixture()
def hub(tmp_path, monkeypatch, target_with_draft):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    with HubServer() as server:
        server.add_repo(REPO, target_with_draft)
        yield server


def test_the_hub_gives_the_same_report(hub, target_with_draft):
    local = build_report(str(target_with_draft), progress=False)
    hub.reset_stats()
    remote = build_report(REPO, progress=False, settings=Settings(endpoint=hub.url))
    assert remote.checkpoint.kind == "hub" and remote.drafts[0].checkpoint.kind == "hub"
    assert _draft_facts(remote) == _draft_facts(local)
    assert remote.mtp.verdicts == local.mtp.verdicts
    assert remote.drafts[0].location.endswith("/dspark")
    # headers only: no request for tensor data (every ranged GET stays inside a header)
    stats = hub.stats()
    assert stats["bytes"] < 1_000_000
    assert any("dspark/model.safetensors" in e[1] for e in stats["log"])


def test_the_hf_cache_gives_the_same_report(hub, target_with_draft):
    from huggingface_hub import snapshot_download

    from ckptinspect.sources.hf_cache import hub_cache_dir

    snapshot_download(REPO, endpoint=hub.url, cache_dir=str(hub_cache_dir()))
    cached = build_report(REPO, progress=False, settings=Settings(endpoint="http://127.0.0.1:9"))
    assert cached.checkpoint.kind == "hf-cache" and cached.drafts[0].checkpoint.kind == "hf-cache"
    assert _draft_facts(cached) == _draft_facts(build_report(str(target_with_draft), progress=False))


def test_hub_repo_without_the_subfolder_says_absent(tmp_path, monkeypatch, make_fixture):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    with HubServer() as server:
        server.add_repo(REPO, make_fixture("minimax_m3_vl"))
        r = build_report(REPO, progress=False, settings=Settings(endpoint=server.url))
    assert r.drafts[0].status == "absent"
    assert {e: v.reasons for e, v in r.drafts[0].verdicts.items()} == {
        "sglang": ("draft-subfolder-absent",), "vllm": ("draft-subfolder-absent",)}


def test_a_report_loads_its_rules_once(target_with_draft, make_fixture, monkeypatch):
    """The source's subfolder choice and the stages share one rule set (pipeline.RulesOnce): a second load
    was ~0.2 s of every report. The draft subfolder's own stages use the same set too."""
    import ckptinspect.readiness as readiness

    calls = []
    real = readiness.load_rules
    monkeypatch.setattr(readiness, "load_rules", lambda *a, **k: calls.append(a) or real(*a, **k))
    for path in (make_fixture("qwen3_5_moe_nvfp4"), target_with_draft):
        calls.clear()
        report = build_report(str(path), progress=False)
        assert len(calls) == 1, (path, calls)
    assert report.drafts and report.drafts[0].status == "present"  # the subfolder was read with that one set
