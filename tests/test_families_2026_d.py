"""Issue 20 §5: the vLLM 0.33.0 draft classes SGLang 0.5.23 does not ship (fixtures/families_2026_d.py).

- Step-5 (Step5MTP): the MTP layer is found at model.layers.{L} with its Step5 decoder layer (head-wise
  gate, sparse indexer projections), vLLM is ready with one layer per step, SGLang has no Step-5 model
  (checked against the installed SGLang 0.5.23 tree, not only the rule), and the dropped-MTP variant is
  unusable in both with the engine-scoped reasons.
"""

from __future__ import annotations

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
    assert mtp.verdicts["sglang"].reasons == ("engine-has-no-draft-model",)
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
        assert "mtp-declared-but-absent" in mtp.verdicts[engine].reasons
    vllm_note = next(f for f in mtp.findings if f.engine == "vllm" and f.code == "mtp-declared-but-absent")
    assert "RuntimeError" in vllm_note.message and vllm_note.severity == "error"
    sglang_note = next(f for f in mtp.findings if f.engine == "sglang" and f.code == "mtp-declared-but-absent")
    assert "no Step-5 model" in sglang_note.message
