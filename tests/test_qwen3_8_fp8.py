"""Qwen3.8-2.4T-A95B-FP8: block FP8 with a ``modules_to_not_convert`` list naming the MTP attention, mtp.fc
and the MTP shared expert (BF16), MTP routed experts FP8.

SGLang 0.5.23 builds the Qwen3.5-style draft with the target's Fp8Config unchanged
(SG:models/qwen3_5_mtp.py:50-93 _mtp_quant_config: only modelopt_mixed / serialized modelopt_fp4 / NPU /
Quark-with-excluded-experts drop it), and Fp8Config asks is_layer_skipped per module, so each module is
built as stored. The family's partial-quantization defect therefore rests on the module table
(``mtp_module_built_unlike_stored``): it fires where a module is built unlike stored, not because the
layer mixes schemes.
"""

from __future__ import annotations

from ckptinspect.pipeline import build_report
from toy_inputs import copy_with_config


def test_mixed_fp8_mtp_is_ready_and_the_table_agrees(report):
    r = report("qwen3_8_fp8_mtp_mixed")
    assert {e: v.verdict for e, v in r.mtp.verdicts.items()} == {"sglang": "ready", "vllm": "ready"}
    assert not [f for f in (*r.checkpoint.findings, *r.mtp.findings) if f.severity == "error"]
    rows = {row.module: row for row in r.mtp.modules}
    assert rows["mtp.layers.0.self_attn.q_proj"].stored == "bf16"
    assert rows["mtp.layers.0.mlp.experts.{}.gate_proj"].stored == "fp8_block"
    for row in rows.values():
        for engine in ("sglang", "vllm"):
            assert row.matches[engine], (row.module, engine, row.built[engine])
    # the stored mix is still said (info), without a verdict built on it
    assert any(f.code == "mtp-partially-quantized" and f.severity == "info" for f in r.checkpoint.findings + r.mtp.findings)


def test_a_bf16_mtp_module_the_list_misses_is_unusable_from_the_table(make_fixture, tmp_path):
    """Not vacuous: drop mtp.layers.0.self_attn.o_proj from the list and Fp8Config builds it FP8 while it
    ships BF16; the table shows it and the defect names it."""
    def edit(cfg):
        q = cfg["quantization_config"]
        q["modules_to_not_convert"] = [m for m in q["modules_to_not_convert"] if m != "mtp.layers.0.self_attn.o_proj"]

    d = copy_with_config(make_fixture("qwen3_8_fp8_mtp_mixed"), tmp_path / "o_proj", edit)
    r = build_report(str(d), progress=False)
    sg = r.mtp.verdicts["sglang"]
    assert sg.verdict == "unusable" and "mtp-partial-quant" in sg.reasons
    finding = next(f for f in r.mtp.findings if f.code == "mtp-partial-quant" and f.engine == "sglang")
    assert "mtp.layers.0.self_attn.o_proj" in finding.message
    row = next(row for row in r.mtp.modules if row.module == "mtp.layers.0.self_attn.o_proj")
    assert row.matches["sglang"] is False and row.built["sglang"] == "fp8"


def test_sglang_builds_the_fp8_draft_per_module():
    """SGLang's own Fp8Config with the release's list: the listed MTP attention / shared expert are
    unquantized, the MTP experts FP8 (Fp8MoEMethod)."""
    from tests.sglang_quant_oracle import ask_sglang

    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["mtp.fc", "mtp.layers.0.self_attn.q_proj", "mtp.layers.0.self_attn.k_proj",
                                     "mtp.layers.0.self_attn.v_proj", "mtp.layers.0.self_attn.o_proj",
                                     "mtp.layers.0.mlp.shared_expert.gate_proj",
                                     "mtp.layers.0.mlp.shared_expert.up_proj",
                                     "mtp.layers.0.mlp.shared_expert.down_proj"]}
    modules = [["mtp.layers.0.self_attn.qkv_proj", "linear"], ["mtp.layers.0.self_attn.o_proj", "linear"],
               ["mtp.layers.0.mlp.shared_expert.gate_up_proj", "linear"], ["mtp.layers.0.mlp.experts", "moe"]]
    (answer,) = ask_sglang([{"method": "fp8", "config": qc, "modules": modules}])
    assert answer["mtp.layers.0.self_attn.qkv_proj"] == answer["mtp.layers.0.self_attn.o_proj"] \
        == answer["mtp.layers.0.mlp.shared_expert.gate_up_proj"] == "UnquantizedLinearMethod"
    assert answer["mtp.layers.0.mlp.experts"] == "Fp8MoEMethod"


def test_a_version_the_engine_rules_do_not_model_shows_not_decided(report):
    """"not decided" is a visible state with its reason: rules/quant/vllm.yaml models vLLM's readings from
    0.32.0 on, so at 0.31.0 every cell the lists decide says so instead of passing the generic reading off
    as vLLM's."""
    from ckptinspect.readiness import assess_mtp, load_rules

    r = report("qwen3_8_fp8_mtp_mixed")
    rules = load_rules()
    old = assess_mtp(r.checkpoint, rules.get(r.mtp.family), rules, engine_versions={"vllm": "0.31.0"})
    cells = [(row.built["vllm"], row.causes["vllm"]) for row in old.modules if row.reasons["vllm"] in ("excluded", "quantized")]
    assert cells and all(b.endswith("(not decided)") and "models no fp8 entry" in c for b, c in cells)
    assert not any("not decided" in row.built["sglang"] for row in old.modules)
