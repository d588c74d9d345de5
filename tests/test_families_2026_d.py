"""Issue 20 §5: the vLLM 0.33.0 draft classes SGLang 0.5.23 does not ship (fixtures/families_2026_d.py).

- Step-5 (Step5MTP): the MTP layer is found at model.layers.{L} with its Step5 decoder layer (head-wise
  gate, sparse indexer projections), vLLM is ready with one layer per step, SGLang has no Step-5 model
  (checked against the installed SGLang 0.5.23 tree, not only the rule), and the dropped-MTP variant is
  unusable in both with the engine-scoped reasons.
- Nemotron Parse 3.5 (ParseAuxMTPModel): the one-step pair decoder.extra_heads.0 / decoder.extra_proj.0 is
  found; the depth is declared by the boolean decoder.causal_vision_prefix (what vLLM's hf_config_override
  reads), and a false flag declares nothing; the vLLM plan drafts exactly one step; SGLang has no model.
"""

from __future__ import annotations

import json
from pathlib import Path

from sglang_parser import ensure_sglang
from test_families_2026_c import sglang_draft_rewrites, sglang_entry_classes


def _sglang_mentions(word: str) -> list[str]:
    models = Path(ensure_sglang()) / "sglang" / "srt" / "models"
    return [p.name for p in models.glob("*.py") if word in p.read_text(encoding="utf-8")]


def test_sglang_0_5_23_has_no_step5_model():
    assert not _sglang_mentions("Step5")  # no Step5ForCausalLM / Step5MTP anywhere in its model files
    assert "Step5ForCausalLM" not in sglang_draft_rewrites() and "Step5MTP" not in sglang_entry_classes()


def test_step5_mtp_layer_found_and_ready_in_vllm(report, fixture_specs):
    mtp = report("step5").mtp
    assert mtp.family == "step5"
    assert [layer.prefix for layer in mtp.layers] == ["model.layers.2."]  # L = num_hidden_layers = 2
    assert mtp.tensors == fixture_specs["step5"].mtp_tensors and not mtp.layers[0].missing
    v = mtp.verdicts["vllm"]
    assert (v.verdict, v.draft_architecture, v.method) == ("ready", "Step5MTP", "mtp")
    assert (mtp.verdicts["sglang"].verdict, mtp.verdicts["sglang"].draft_architecture) == ("unusable", None)
    assert mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)  # no Step5ForCausalLM in SGLang 0.5.23
    assert not [f for f in mtp.findings if f.severity == "error" and f.engine != "sglang"]


def test_step5_indexer_and_gate_count_as_mtp(fixture_specs):
    mtp_names = {t.name for t in fixture_specs["step5"].tensors if t.mtp}
    assert {"model.layers.2.self_attn.sparse_indexer_q.weight", "model.layers.2.self_attn.g_proj.weight",
            "model.layers.2.shared_head.head.weight"} <= mtp_names


def test_step5_dropped_mtp_is_unusable_in_both(report):
    mtp = report("step5_nomtp").mtp
    assert (mtp.declared_layers, mtp.present_layers) == (1, 0)
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
    assert "mtp-declared-but-absent" in mtp.verdicts["vllm"].reasons
    # SGLang cannot load the target at all: that is its one answer, not a missing draft layer
    assert mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)
    # vLLM 0.34.0 (the version answered by default) removed the completeness check: the error says so, and
    # the RuntimeError of the releases before it is a version-tagged note
    vllm_notes = [f for f in mtp.findings if f.engine == "vllm" and f.code == "mtp-declared-but-absent"]
    current = [f for f in vllm_notes if f.severity == "error"]
    assert len(current) == 1 and "removed the MTP completeness check" in current[0].message
    older = [f for f in vllm_notes if f.message.startswith("[vllm <0.34]")]
    assert len(older) == 1 and "RuntimeError" in older[0].message and older[0].severity == "info"
    sglang_note = next(f for f in mtp.findings if f.engine == "sglang")
    assert "registers no model class for Step5ForCausalLM" in sglang_note.message


# ---- Nemotron Parse 3.5 (ParseAuxMTPModel) ----------------------------------------------------------------

def test_sglang_0_5_23_has_no_nemotron_parse_model():
    assert not _sglang_mentions("RadioMBartPrefix") and not _sglang_mentions("NemotronParse")
    assert "RadioMBartPrefixForCausalLM" not in sglang_draft_rewrites()


def test_parse35_aux_heads_found_and_ready_in_vllm(report, fixture_specs):
    mtp = report("nemotron_parse35").mtp
    assert mtp.family == "nemotron_parse35"
    # the config has no count: decoder.causal_vision_prefix is what makes vLLM build the one-step draft
    assert (mtp.declared_key, mtp.declared_layers, mtp.present_layers) == ("decoder.causal_vision_prefix", 1, 1)
    assert mtp.tensors == fixture_specs["nemotron_parse35"].mtp_tensors == 4 and not mtp.layers[0].missing
    v = mtp.verdicts["vllm"]
    assert (v.verdict, v.draft_architecture, v.method) == ("ready", "ParseAuxMTPModel", "mtp")
    assert mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)


def test_parse35_vllm_plan_drafts_one_step(make_fixture):
    """vLLM refuses num_speculative_tokens other than 1 for ParseAuxMTPModel (VL:config/speculative.py)."""
    from ckptinspect.api import plan

    p = plan(str(make_fixture("nemotron_parse35")), gpu="h200", gpus=1)
    args = [a for f in p.commands["vllm"].flags for a in f.args()]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert (spec["method"], spec["num_speculative_tokens"]) == ("mtp", 1)


def test_parse35_dropped_heads_are_unusable_in_both(report):
    mtp = report("nemotron_parse35_nomtp").mtp
    assert (mtp.declared_layers, mtp.present_layers) == (1, 0)
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
    assert "mtp-declared-but-absent" in mtp.verdicts["vllm"].reasons
    assert mtp.verdicts["sglang"].reasons == ("arch-unknown-to-engine",)  # no model class for the target
    note = next(f for f in mtp.findings if f.engine == "vllm" and f.code == "mtp-declared-but-absent")
    assert "Following weights were not initialized" in note.message and note.severity == "error"


def test_flag_key_false_declares_nothing(report, make_fixture, tmp_path):
    """The flag is read, not assumed: with decoder.causal_vision_prefix false nothing is declared."""
    import shutil

    from ckptinspect.pipeline import build_report

    src = make_fixture("nemotron_parse35_nomtp")
    dst = tmp_path / "parse_noflag"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["decoder"]["causal_vision_prefix"] = False
    (dst / "config.json").write_text(json.dumps(cfg))
    mtp = build_report(str(dst), progress=False).mtp
    assert (mtp.declared_key, mtp.declared_layers) == (None, None)
    assert "mtp-declared-but-absent" not in mtp.verdicts["vllm"].reasons


def test_step5_mtp_layer_without_its_head_is_unusable_in_vllm(report):
    """Step5MTP keeps a head per layer (has_own_lm_head); without it vLLM's load check fails."""
    mtp = report("step5_mtp_no_head").mtp
    assert mtp.present_layers == 1 and mtp.layers[0].missing
    v = mtp.verdicts["vllm"]
    assert v.verdict == "unusable" and "mtp-missing-tensors" in v.reasons
    note = next(f for f in mtp.findings if f.engine == "vllm" and f.code == "mtp-missing-tensors")
    assert "shared_head" in note.message and "RuntimeError" in note.message
