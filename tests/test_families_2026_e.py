"""Issue 31 item 5: drafts vLLM 0.34.0 added (fixtures/families_2026_e.py).

- Nemotron-3.5-Transcribe (Nemotron3_5TranscribeMTPModel): the MTP head under llm.mtp.* is found in the BF16
  (NeMo names, packed experts), FP8 and NVFP4 releases; vLLM 0.34.0 drafts it, vLLM before 0.34 and SGLang 0.5.23
  cannot. The FP8 / NVFP4 exports quantize the MTP head, eh_proj included, and are judged by what vLLM 0.34.0
  builds for those modules: the draft takes the checkpoint's quantization_config (hf_config_override copies it)
  and NemotronHMTP's eh_proj is a quantizable ColumnParallelLinear, so nothing is "plain-Linear quantized".
- MiniMax-M3.1 DSpark draft (the dspark/ subfolder, DSparkMiniMaxDraftModel): both engines have it (vLLM from
  0.34.0); its layers and shared heads are counted; an incomplete draft is unusable in both.
- Kimi-K3.1 (KimiK31ForConditionalGeneration / kimi_k31): vLLM 0.34.0 serves the target with the Kimi-K3 classes but
  its MTP rewrite matches model_type kimi_k3 only, so method mtp builds no KimiK3MTP (rules/families/kimi_k31.yaml
  traces the path); SGLang 0.5.23 has no K3.1 model at all.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ckptinspect.readiness import assess_mtp, load_rules
from sglang_parser import ensure_sglang
from test_families_2026_c import sglang_draft_rewrites, sglang_entry_classes
from vllm_source import vllm_034_text

def _at_vllm(report, name: str, version: str):
    r = report(name)
    rules = load_rules()
    return assess_mtp(r.checkpoint, rules.get(r.mtp.family), rules, engine_versions={"vllm": version})


TRANSCRIBE = ("nemotron3_5_transcribe", "nemotron3_5_transcribe_fp8", "nemotron3_5_transcribe_nvfp4")


def _sglang_srt() -> Path:
    return Path(ensure_sglang()) / "sglang" / "srt"


def test_sglang_0_5_23_has_no_nemotron3_5_transcribe():
    srt = _sglang_srt()
    hits = [p.name for p in srt.rglob("*.py")
            if re.search(r"Nemotron3_5Transcribe|nemo_speechlm", p.read_text(encoding="utf-8", errors="replace"))]
    assert hits == []
    assert "Nemotron3_5TranscribeForConditionalGeneration" not in sglang_draft_rewrites()


def test_sglang_0_5_23_registers_the_minimax_dspark_draft():
    assert "DSparkMiniMaxDraftModel" in sglang_entry_classes()
    # _config_draft_model translates that draft config when the algorithm is DSPARK
    src = (_sglang_srt() / "configs" / "model_config.py").read_text(encoding="utf-8")
    assert '"DSparkMiniMaxDraftModel"' in src and "configure_minimax_m3_dspark" in src


@pytest.mark.parametrize("name", TRANSCRIBE)
def test_transcribe_mtp_head_found_and_drafted_by_vllm_only(name, report, fixture_specs):
    mtp = report(name).mtp
    assert mtp.family == "nemotron3_5_transcribe"
    assert [layer.prefix for layer in mtp.layers] == ["llm.mtp."]
    assert (mtp.declared_layers, mtp.present_layers) == (1, 1)
    assert mtp.tensors == fixture_specs[name].mtp_tensors and not mtp.layers[0].missing
    v = mtp.verdicts["vllm"]
    assert (v.draft_architecture, v.method) == ("Nemotron3_5TranscribeMTPModel", "mtp")
    s = mtp.verdicts["sglang"]
    # SGLang 0.5.23 registers no Nemotron3_5TranscribeForConditionalGeneration: it cannot load the target
    assert (s.verdict, s.draft_architecture, s.reasons) == ("unusable", None, ("arch-unknown-to-engine",))


def test_transcribe_bf16_packed_experts_count_as_mtp(fixture_specs, report):
    names = {t.name for t in fixture_specs["nemotron3_5_transcribe"].tensors if t.mtp}
    assert {"llm.mtp.layers.1.mixer.experts.gate_and_up_projs", "llm.mtp.layers.1.mixer.experts.down_projs",
            "llm.mtp.layers.0.eh_proj.weight"} <= names
    assert report("nemotron3_5_transcribe").mtp.verdicts["vllm"].verdict == "ready"


@pytest.mark.parametrize("name, label, verdict, reasons", [
    ("nemotron3_5_transcribe_fp8", "modelopt:FP8", "ready", ()),
    ("nemotron3_5_transcribe_nvfp4", "modelopt:NVFP4", "degraded", ("mtp-quantized-4bit",)),
])
def test_transcribe_quantized_mtp_head_is_built_quantized_by_vllm(name, label, verdict, reasons, report):
    r = report(name)
    v = r.mtp.verdicts["vllm"]
    assert (v.verdict, v.reasons) == (verdict, reasons)
    # every stored-quantized MTP module, eh_proj included, is one vLLM 0.34.0 builds quantized (no module is
    # forced unquantized: NemotronHMTP's eh_proj is a ColumnParallelLinear with the draft quant config)
    quantized = [m for m in r.mtp.modules if m.stored not in ("bf16", "fp16", "fp32", "other")]
    assert any(m.module == "llm.mtp.layers.0.eh_proj" for m in quantized)
    assert quantized and all(m.built["vllm"] not in ("unquantized", "load error") and m.matches["vllm"]
                             for m in quantized)
    assert "mtp-plain-linear-quantized" not in v.reasons
    assert not [f for f in r.mtp.findings if f.engine == "vllm" and f.severity == "error"]


def test_transcribe_head_needs_vllm_0_34(report):
    old = _at_vllm(report, "nemotron3_5_transcribe", "0.33.0").verdicts["vllm"]
    assert (old.verdict, old.reasons) == ("unusable", ("engine-has-no-draft-model",))


def test_transcribe_dropped_head_is_unusable(report):
    mtp = report("nemotron3_5_transcribe_nomtp").mtp
    assert (mtp.declared_layers, mtp.present_layers) == (1, 0)
    assert "mtp-declared-but-absent" in mtp.verdicts["vllm"].reasons


def test_vllm_0_34_copies_the_quant_config_into_the_transcribe_draft():
    """The rule's premise, read from the engine: hf_config_override keeps quantization_config for this draft."""
    text = vllm_034_text("config", "speculative.py")
    block = text[text.index('== "Nemotron3_5TranscribeForConditionalGeneration"'):]
    block = block[:block.index("Nemotron3_5TranscribeMTPModel")]
    assert "hf_config.quantization_config = copy.deepcopy(quantization_config)" in block
    ast.parse(text)


def test_minimax_dspark_draft_counted_and_ready_in_both(report, fixture_specs):
    mtp = report("minimax_m3_dspark").mtp
    assert mtp.family == "minimax_m3_dspark"
    assert (mtp.declared_layers, mtp.present_layers) == (2, 2)
    assert mtp.tensors == fixture_specs["minimax_m3_dspark"].mtp_tensors == len(fixture_specs["minimax_m3_dspark"].tensors)
    for engine, arch, method in (("vllm", "DSparkMiniMaxDraftModel", "dspark"),
                                 ("sglang", "DSparkMiniMaxDraftModel", "DSPARK")):
        v = mtp.verdicts[engine]
        assert (v.verdict, v.draft_architecture, v.method) == ("ready", arch, method)
    old = _at_vllm(report, "minimax_m3_dspark", "0.33.0").verdicts["vllm"]
    assert (old.verdict, old.reasons) == ("unusable", ("engine-has-no-draft-model",))


def test_minimax_dspark_without_markov_head_is_unusable(report):
    mtp = report("minimax_m3_dspark_no_markov").mtp
    missing = {m for layer in mtp.layers for m in layer.missing}
    assert {"markov_head.markov_w1", "markov_head.markov_w2"} <= {m.rsplit("dspark.", 1)[-1] for m in missing}
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
        assert "mtp-missing-tensors" in mtp.verdicts[engine].reasons


# ---- Kimi-K3.1 in vLLM 0.34.0 -------------------------------------------------------------------------------

def _vllm_src(*parts: str) -> str:
    """An engine source file, named by its path parts under vllm/ (never a path of this repository)."""
    return vllm_034_text(*parts)


def test_kimi_k31_target_is_kimi_k3_but_its_mtp_is_not_drafted(report, fixture_specs):
    r = report("kimi_k31")
    assert r.checkpoint.family == "kimi_k31"
    mtp = r.mtp
    assert (mtp.declared_layers, mtp.present_layers) == (1, 1) and mtp.complete
    assert mtp.tensors == fixture_specs["kimi_k31"].mtp_tensors == report("kimi_k3").mtp.tensors
    v = mtp.verdicts["vllm"]
    assert (v.verdict, v.reasons, v.method, v.draft_architecture) == (
        "unusable", ("mtp-draft-config-not-rewritten",), "mtp", None)
    s = mtp.verdicts["sglang"]
    assert (s.verdict, s.reasons) == ("unusable", ("arch-unknown-to-engine",))  # no KimiK31ForConditionalGeneration
    # scoped to the engines: nothing the checkpoint itself did wrong
    assert not [f for f in r.checkpoint.findings if f.severity == "error"]
    errors = {(f.engine, f.code) for f in mtp.findings if f.severity == "error"}
    assert errors == {("vllm", "mtp-draft-config-not-rewritten"), ("sglang", "arch-unknown-to-engine")}
    # Kimi-K3 itself stays drafted by vLLM
    assert report("kimi_k3").mtp.verdicts["vllm"].verdict == "ready"


def test_kimi_k31_before_vllm_0_34_has_no_model(report):
    old = _at_vllm(report, "kimi_k31", "0.33.0").verdicts["vllm"]
    assert (old.verdict, old.reasons) == ("unusable", ("engine-has-no-draft-model",))


def test_vllm_0_34_maps_k31_to_k3_but_rewrites_only_kimi_k3_for_mtp():
    """The rule's premises, read from the engine source."""
    registry = _vllm_src("model_executor/models/registry.py")
    block = registry[registry.index('"KimiK31ForConditionalGeneration": ('):]
    assert '"KimiK3ForConditionalGeneration"' in block[:block.index(")")]
    configs = _vllm_src("transformers_utils/config.py")
    assert 'kimi_k31="KimiK3Config"' in configs
    assert "config_class.model_type = model_type" in configs  # registered under kimi_k31: model_type stays
    assert 'model_type == "kimi_k31"' in _vllm_src("renderers/kimi_k3.py")
    spec = _vllm_src("config", "speculative.py")
    override = spec[spec.index("def hf_config_override"):]
    assert 'if hf_config.model_type == "kimi_k3":' in override
    assert "kimi_k31" not in override and "KimiK31" not in override
    mtp = _vllm_src("v1/worker/gpu/spec_decode/mtp/config.py")
    assert "return target.model_weights or target.model" in mtp  # the draft is the target checkpoint
    eagle = _vllm_src("v1/worker/gpu/spec_decode/eagle/utils.py")
    assert "draft_inner = eagle_model.model" in eagle
    model = _vllm_src("models/kimi_k3/nvidia/model.py")
    cls = model[model.index("class KimiK3ForConditionalGeneration("):]
    cls = cls[:cls.index("\nclass ") if "\nclass " in cls else len(cls)]
    assert "self.language_model = " in cls and "self.model = " not in cls


def test_sglang_0_5_23_has_no_kimi_k31():
    srt = _sglang_srt()
    hits = [p.name for p in srt.rglob("*.py")
            if re.search(r"KimiK31|kimi_k31", p.read_text(encoding="utf-8", errors="replace"))]
    assert hits == []
