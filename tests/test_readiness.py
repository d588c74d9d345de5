"""MTP readiness per engine on the generated fixtures: one test per situation of the issue, the
full verdict table, and invariance to tensor order, shard names and expert storage."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from ckptinspect.pipeline import build_report
from ckptinspect.readiness import assess_mtp, load_rules
from ckptinspect.plan.mtp_cost import mtp_cost
from ckptinspect.records import VERDICTS
from toy_inputs import copy_with_config

# fixture -> (SGLang 0.5.23, vLLM 0.33.0) verdicts; reasons are checked in the situation tests.
EXPECTED = {
    "qwen3_5_moe_nvfp4": ("ready", "ready"),
    "qwen3_5_moe_nvfp4_fused": ("ready", "ready"),
    "qwen3_5_dense_bf16": ("ready", "ready"),
    "qwen3_5_moe_ct_nvfp4": ("ready", "ready"),
    "qwen3_5_moe_mtp_fc_excluded": ("ready", "ready"),
    "qwen3_5_moe_nvfp4_nomtp": ("unusable", "unusable"),
    "qwen3_5_moe_mtp_partial_quant": ("unusable", "degraded"),
    "qwen3_5_moe_mtp_incomplete": ("unusable", "unusable"),
    "qwen3_next_bf16": ("ready", "ready"),
    "deepseek_v3_fp8": ("ready", "ready"),
    "deepseek_v3_nvfp4": ("ready", "ready"),
    "deepseek_v3_mixed": ("ready", "ready"),
    "deepseek_v3_nvfp4_nomtp": ("unusable", "unusable"),
    "deepseek_v3_nvfp4_mtp_fp4": ("unusable", "degraded"),
    "deepseek_v3_depth_mismatch": ("ready", "unusable"),  # SGLang forces depth 1 for the draft
    "deepseek_v32_fp8": ("ready", "ready"),
    "kimi_k2": ("absent", "absent"),
    "kimi_k2_5": ("absent", "absent"),
    "glm4_moe": ("ready", "ready"),
    "glm4_moe_lite": ("ready", "ready"),
    "glm_moe_dsa": ("ready", "ready"),
    "mimo_7b": ("ready", "ready"),
    "mimo_v2_flash": ("ready", "degraded"),
    "ernie4_5_moe": ("ready", "ready"),
    "longcat_flash": ("ready", "ready"),
    "step3p5": ("ready", "ready"),
    "nemotron_h": ("ready", "ready"),
    "bailing_moe": ("ready", "ready"),
    "minimax_m2": ("unusable", "unusable"),
    "gpt_oss_mxfp4": ("absent", "absent"),
    "llama_bf16": ("absent", "absent"),
    "qwen3_moe_bf16": ("absent", "absent"),
}


def reasons(mtp, engine: str) -> set[str]:
    return set(mtp.verdicts[engine].reasons)


def codes(mtp, engine: str | None = "any") -> set[str]:
    return {f.code for f in mtp.findings if engine == "any" or f.engine == engine}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_verdict_table(report, name):
    r = report(name)
    mtp = r.mtp
    assert (mtp.verdicts["sglang"].verdict, mtp.verdicts["vllm"].verdict) == EXPECTED[name]
    assert mtp.family == r.checkpoint.family
    for v in mtp.verdicts.values():
        assert v.verdict in VERDICTS
        if v.verdict in ("unusable", "degraded"):
            assert v.reasons, "a non-ready verdict must name its reasons"
            assert {f.code for f in mtp.findings if f.engine == v.engine} >= set(v.reasons)
        if mtp.declared_layers and mtp.present_layers == 0:
            assert v.verdict == "unusable"  # declared but absent is never ready or absent


def test_present_and_complete_qwen3_5_nvfp4(report):
    mtp = report("qwen3_5_moe_nvfp4").mtp
    assert mtp.family == "qwen3_5_moe" and mtp.present_layers == 1 and mtp.complete
    assert (mtp.declared_key, mtp.declared_layers) == ("text_config.mtp_num_hidden_layers", 1)
    layer = mtp.layers[0]
    assert layer.prefix == "mtp." and layer.missing == () and (layer.experts_present, layer.experts_expected) == (4, 4)
    assert set(layer.schemes) == {"bf16"}
    sg, vl = mtp.verdicts["sglang"], mtp.verdicts["vllm"]
    assert sg.draft_architecture == "Qwen3_5ForCausalLMMTP" and sg.method == "NEXTN"
    assert sg.draft_quantization is None  # _mtp_quant_config: modelopt_fp4 -> None
    # vLLM builds the draft with the target's modelopt:NVFP4 config, but per module: every MTP Linear
    # is covered by mtp.layers.0* or is the forced-BF16 mtp.fc (>= 0.32), so nothing is built NVFP4
    assert vl.draft_architecture == "Qwen3_5MoeMTP" and vl.draft_quantization is None
    assert vl.module_quantization and all(built is None for _, built in vl.module_quantization)
    older = assess_mtp(report("qwen3_5_moe_nvfp4").checkpoint, load_rules().get("qwen3_5_moe"), load_rules(),
                       engine_versions={"vllm": "0.31.1"}).verdicts["vllm"]
    assert older.draft_quantization == "modelopt:NVFP4"  # before 0.32 mtp.fc is built NVFP4
    assert {m for m, built in older.module_quantization if built} == {"mtp.fc"}
    assert sg.layers_used == vl.layers_used == 1
    old = [f for f in mtp.findings if f.code == "mtp-fc-not-excluded-old-vllm"]
    assert len(old) == 1 and old[0].severity == "info" and "mtp.fc" in old[0].message and "<0.32" in old[0].message


def test_uncovered_mtp_fc_crashes_older_vllm(report, make_fixture):
    r = report("qwen3_5_moe_nvfp4")
    ruleset = load_rules()
    family = ruleset.get("qwen3_5_moe")
    old = assess_mtp(r.checkpoint, family, ruleset, engine_versions={"vllm": "0.31.1"})
    assert old.verdicts["vllm"].verdict == "unusable"
    # 0.32.0 forces mtp.fc BF16 already (its dry-load: tests/test_verify_vs_rules.py)
    assert assess_mtp(r.checkpoint, family, ruleset, engine_versions={"vllm": "0.32.0"}).verdicts["vllm"].verdict == "ready"
    assert "mtp-fc-not-excluded-old-vllm" in reasons(old, "vllm")
    assert old.verdicts["sglang"].verdict == "ready"
    # the fixed export lists mtp.fc: nothing to report for any version
    fixed = report("qwen3_5_moe_mtp_fc_excluded").checkpoint
    for version in ("0.31.1", "0.32.0", "0.33.0"):
        m = assess_mtp(fixed, family, ruleset, engine_versions={"vllm": version})
        assert m.verdicts["vllm"].verdict == "ready" and "mtp-fc-not-excluded-old-vllm" not in codes(m)


def test_deepseek_fp8_layer_L(report):
    r = report("deepseek_v3_fp8")
    mtp = r.mtp
    L = r.checkpoint.config.num_hidden_layers
    assert mtp.layers[0].prefix == f"model.layers.{L}."
    assert mtp.layers[0].schemes.get("fp8_block", 0) > 0
    assert mtp.verdicts["sglang"].draft_quantization == mtp.verdicts["vllm"].draft_quantization == "fp8"
    assert mtp.verdicts["sglang"].draft_architecture == "DeepseekV3ForCausalLMNextN"


@pytest.mark.parametrize("name,key", [
    ("minimax_m2", "num_mtp_modules"),
    ("qwen3_5_moe_nvfp4_nomtp", "text_config.mtp_num_hidden_layers"),
    ("deepseek_v3_nvfp4_nomtp", "num_nextn_predict_layers"),
])
def test_declared_but_absent_is_unusable(report, name, key):
    mtp = report(name).mtp
    assert mtp.present_layers == 0 and mtp.declared_key == key and mtp.declared_layers >= 1
    assert not mtp.complete
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
        # MiniMax-M2: the publisher documents the missing weights, a distinct code (issue 26 item 5)
        code = "mtp-declared-not-published" if name == "minimax_m2" else "mtp-declared-but-absent"
        assert code in reasons(mtp, engine)
        assert mtp.verdicts[engine].layers_used == 0
        if mtp.verdicts[engine].draft_architecture is None:  # MiniMax-M2: no draft model at all
            assert mtp.verdicts[engine].draft_quantization is None
    finding = next(f for f in mtp.findings if f.code == code and f.engine == "vllm")
    assert finding.hint and finding.reference


def test_deepseek_missing_layer_message_names_the_vllm_check(report, make_fixture):
    """vLLM 0.33.0 raises (its MTP completeness check); 0.34.0 removed the check and loads silently."""
    from ckptinspect.pipeline import build_report

    mtp = report("deepseek_v3_nvfp4_nomtp").mtp
    msg = next(f.message for f in mtp.findings if f.code == "mtp-declared-but-absent" and f.engine == "vllm"
               and not f.message.startswith("[vllm "))  # the other release's entry is a tagged note
    assert mtp.verdicts["vllm"].engine_version == "0.34.0"
    assert "removed the MTP completeness check" in msg and "loads silently" in msg
    assert mtp.verdicts["vllm"].verdict == "unusable"
    old = build_report(str(make_fixture("deepseek_v3_nvfp4_nomtp")), progress=False,
                       engine_versions={"vllm": "0.33.0"}).mtp
    msg = next(f.message for f in old.findings if f.code == "mtp-declared-but-absent" and f.engine == "vllm"
               and not f.message.startswith("[vllm "))
    assert old.verdicts["vllm"].engine_version == "0.33.0"
    assert "ValueError" in msg and "#35548" in msg


def test_present_without_config_key(report):
    mtp = report("qwen3_next_bf16").mtp
    assert mtp.declared_key is None and mtp.present_layers == 1
    assert mtp.verdicts["sglang"].verdict == mtp.verdicts["vllm"].verdict == "ready"
    undeclared = [f for f in mtp.findings if f.code == "mtp-undeclared"]
    assert len(undeclared) == 1 and undeclared[0].engine is None and "mtp." in undeclared[0].message


def test_incomplete_mtp(report):
    mtp = report("qwen3_5_moe_mtp_incomplete").mtp
    layer = mtp.layers[0]
    assert "fc" in layer.missing and (layer.experts_present, layer.experts_expected) == (2, 4)
    assert not mtp.complete
    for engine in ("sglang", "vllm"):
        assert {"mtp-missing-tensors", "mtp-missing-experts"} <= reasons(mtp, engine)
    msg = next(f.message for f in mtp.findings if f.code == "mtp-missing-experts")
    assert "ids 2, 3" in msg


def test_depth_disagrees_with_tensors(report):
    mtp = report("deepseek_v3_depth_mismatch").mtp
    assert mtp.declared_layers == 2 and mtp.present_layers == 1 and not mtp.complete
    assert "mtp-depth-exceeds-tensors" in reasons(mtp, "vllm") and "mtp-depth-exceeds-tensors" in reasons(mtp, "sglang")
    sglang_note = next(f for f in mtp.findings if f.code == "mtp-depth-exceeds-tensors" and f.engine == "sglang")
    assert sglang_note.severity == "warning" and "layer 0" in sglang_note.message
    assert "mtp-depth-mismatch" in codes(mtp, None)


def test_nvfp4_mtp_forced_unquantized_by_sglang(report):
    mtp = report("deepseek_v3_nvfp4_mtp_fp4").mtp
    assert mtp.layers[0].schemes.get("nvfp4", 0) > 0
    sg = mtp.verdicts["sglang"]
    assert sg.draft_quantization is None and "mtp-quantized-but-built-unquantized" in sg.reasons
    finding = next(f for f in mtp.findings if f.code == "mtp-quantized-but-built-unquantized")
    assert "36599" in finding.reference
    assert "mtp-quantized-4bit" in reasons(mtp, "vllm")


def test_partially_quantized_mtp(report):
    mtp = report("qwen3_5_moe_mtp_partial_quant").mtp
    assert set(mtp.layers[0].schemes) == {"bf16", "nvfp4"}
    partial = next(f for f in mtp.findings if f.code == "mtp-partially-quantized")
    assert "routed_expert: nvfp4" in partial.message and "attention: bf16" in partial.message
    assert "mtp-quantized-but-built-unquantized" in reasons(mtp, "sglang")


def test_several_layers_reuse_vs_per_step(report):
    mimo = report("mimo_v2_flash").mtp
    assert mimo.present_layers == 3 and mimo.declared_layers == 3
    assert (mimo.verdicts["sglang"].verdict, mimo.verdicts["sglang"].layers_used) == ("ready", 3)
    assert (mimo.verdicts["vllm"].verdict, mimo.verdicts["vllm"].layers_used) == ("degraded", 1)
    assert reasons(mimo, "vllm") == {"mtp-extra-layers-unused"}
    step = report("step3p5").mtp
    assert step.present_layers == 3
    assert all(v.layers_used == 3 and v.verdict == "ready" for v in step.verdicts.values())


def _mimo_with_fp8_mtp_o_proj(tmp_path: Path, edit_config) -> Path:
    """mimo_v2_flash with the MTP layers' self_attn.o_proj stored block-FP8 (weight + weight_scale_inv)
    instead of the release's BF16, its config edited by ``edit_config``."""
    from dataclasses import replace as replace_spec

    from fixtures.generate import FIXTURES, write_fixture
    from fixtures.tensors import Linear, quantize_linear

    spec = FIXTURES["mimo_v2_flash"]
    tensors = []
    for t in spec.tensors:
        if t.mtp and t.name.endswith("self_attn.o_proj.weight"):
            rows, cols = t.shape
            tensors += [replace_spec(d, mtp=True, shard=t.shard)
                        for d in quantize_linear(Linear(t.name[: -len(".weight")], rows, cols), "fp8_block")]
        else:
            tensors.append(t)
    config = json.loads(json.dumps(spec.config))
    edit_config(config)
    return write_fixture(replace_spec(spec, name="mimo_fp8_mtp_o_proj", config=config, tensors=tuple(tensors)),
                         tmp_path)


def test_mimo_v2_vllm_builds_the_mtp_o_proj_unquantized(tmp_path):
    """vLLM builds the MTP layers' o_proj with quant_config=None (VL:model_executor/models/mimo_v2.py
    MiMoV2Attention: `"mtp.layers" in prefix`): a block-FP8 o_proj cannot load. SGLang builds it from the
    declared config, FP8 here because no ignored_layers entry names model.decoder.self_attn.o_proj."""
    def drop_draft_entry(cfg):
        q = cfg["quantization_config"]
        q["ignored_layers"] = [e for e in q["ignored_layers"] if not e.startswith("model.decoder.")]

    mtp = build_report(str(_mimo_with_fp8_mtp_o_proj(tmp_path, drop_draft_entry)), progress=False).mtp
    assert mtp.verdicts["vllm"].verdict == "unusable"
    assert "mtp-plain-linear-quantized" in reasons(mtp, "vllm")
    assert mtp.verdicts["sglang"].verdict == "ready"
    o_proj = next(m for m in mtp.modules if m.module == "model.mtp.layers.0.self_attn.o_proj")
    assert (o_proj.reasons["vllm"], o_proj.reasons["sglang"]) == ("forced", "quantized")


def test_mimo_v2_sglang_asks_ignored_layers_under_the_draft_name(make_fixture, tmp_path):
    """SGLang 0.5.23 asks Fp8Config about model.decoder.self_attn.o_proj only (MiMoV2MTP maps no names):
    the release's entry for it keeps the BF16 MTP o_proj unquantized; without it the module is built FP8,
    although model.layers.<k>.self_attn.o_proj, read as SGLang reads ignored_layers (dotted substring of
    the checkpoint name model.mtp.layers.<k>.self_attn.o_proj), would cover the stored name."""
    release = build_report(str(make_fixture("mimo_v2_flash")), progress=False)
    assert release.mtp.verdicts["sglang"].verdict == "ready"
    # the checkpoint findings read the entry as SGLang does: it covers the MTP o_proj and matches something
    assert not [f for f in release.checkpoint.findings if f.code == "exclude-entry-matches-nothing"
                or (f.code == "unquantized-not-excluded" and "o_proj" in f.message)]

    def drop_draft_entry(cfg):
        q = cfg["quantization_config"]
        q["ignored_layers"] = [e for e in q["ignored_layers"] if not e.startswith("model.decoder.")]

    path = copy_with_config(make_fixture("mimo_v2_flash"), tmp_path / "no_draft_entry", drop_draft_entry)
    mtp = build_report(str(path), progress=False).mtp
    assert mtp.verdicts["sglang"].verdict == "unusable"
    assert "mtp-bf16-not-excluded" in reasons(mtp, "sglang")
    bf16 = next(f for f in mtp.findings if f.code == "mtp-bf16-not-excluded" and f.engine == "sglang")
    assert "model.mtp.layers.0.self_attn.o_proj" in bf16.message
    assert any(f.code == "unquantized-not-excluded" and "model.mtp.layers.N.self_attn.o_proj" in f.message
               for f in build_report(str(path), progress=False).checkpoint.findings)
    assert mtp.verdicts["vllm"].verdict == "degraded"  # vLLM builds it BF16 whatever the list says


def test_mimo_v2_without_auto_map_sglang_cannot_build_the_draft(make_fixture, tmp_path):
    """Without auto_map transformers' own MiMoV2FlashConfig reads the config (per-layer-type
    rope_parameters), which SGLang 0.5.23's get_rope cannot key (TypeError: unhashable type: 'dict')."""
    path = copy_with_config(make_fixture("mimo_v2_flash"), tmp_path / "no_auto_map", lambda cfg: cfg.pop("auto_map"))
    mtp = build_report(str(path), progress=False).mtp
    assert mtp.verdicts["sglang"].verdict == "unusable"
    assert reasons(mtp, "sglang") == {"rope-parameters-per-layer-type"}
    assert mtp.verdicts["vllm"].verdict == "degraded"


def test_kimi_k2_depth_zero_is_absent(report):
    mtp = report("kimi_k2").mtp
    assert mtp.family == "deepseek_v3" and mtp.declared_layers == 0 and mtp.present_layers == 0
    assert mtp.findings == () or all(f.severity != "error" for f in mtp.findings)




def test_bf16_mtp_not_in_ignore_list_compressed_tensors(make_fixture, tmp_path):
    def drop_mtp_ignore(cfg):
        cfg["quantization_config"]["ignore"] = [e for e in cfg["quantization_config"]["ignore"] if "mtp" not in e]

    path = copy_with_config(make_fixture("qwen3_5_moe_ct_nvfp4"), tmp_path / "ct_no_mtp_ignore", drop_mtp_ignore)
    mtp = build_report(str(path), progress=False).mtp
    for engine in ("sglang", "vllm"):
        assert mtp.verdicts[engine].verdict == "unusable"
        assert "mtp-bf16-not-excluded" in reasons(mtp, engine)
    def listed(engine: str) -> str:
        msg = next(f.message for f in mtp.findings if f.code == "mtp-bf16-not-excluded" and f.engine == engine)
        return msg.split("(", 1)[1].rsplit("); ", 1)[0]

    assert "mtp.layers.0.mlp.experts.{}.down_proj" in listed("vllm")
    # fc: vLLM quantizes it under compressed-tensors (forced BF16 only for modelopt_fp4) while
    # SGLang's Qwen3.5 MTP builds it as a plain nn.Linear
    assert "mtp.fc" in listed("vllm") and "mtp.fc" not in listed("sglang")
    hint = next(f.hint for f in mtp.findings if f.code == "mtp-bf16-not-excluded" and f.engine == "vllm")
    assert "re:mtp\\..*" in hint  # spelled for compressed-tensors re.match semantics


def test_unknown_family_generic_scan(make_fixture, tmp_path):
    def rename(cfg):
        cfg["architectures"], cfg["model_type"] = ["MysteryMoeForCausalLM"], "mystery_moe"

    path = copy_with_config(make_fixture("deepseek_v3_fp8"), tmp_path / "mystery", rename)
    r = build_report(str(path), progress=False)
    mtp = r.mtp
    assert r.checkpoint.family is None and mtp.family is None
    assert "unknown-family" in codes(mtp, None)
    L = r.checkpoint.config.num_hidden_layers
    assert mtp.present_layers == 1 and mtp.layers[0].prefix == f"model.layers.{L}."
    assert mtp.declared_key == "num_nextn_predict_layers"
    for v in mtp.verdicts.values():
        assert v.verdict == "degraded" and v.reasons == ("unknown-family-mtp",) and v.draft_architecture is None
    # an unknown family without MTP tensors: absent, still flagged as unknown
    plain = copy_with_config(make_fixture("llama_bf16"), tmp_path / "plain", rename)
    m = build_report(str(plain), progress=False).mtp
    assert m.family is None and m.present_layers == 0 and "unknown-family" in codes(m, None)
    assert {v.verdict for v in m.verdicts.values()} == {"absent"}


# --- invariance: tensor order, shard names, expert storage -------------------------------------

def _read(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write(path: Path, tensors: list[tuple[str, str, list[int], bytes]]) -> None:
    header, offset = {}, 0
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(t[3] for t in tensors))


def _all_tensors(d: Path) -> list[tuple[str, str, list[int], bytes]]:
    out = []
    for shard in sorted(d.glob("*.safetensors")):
        header, data = _read(shard)
        for name, info in header.items():
            if name != "__metadata__":
                a, b = info["data_offsets"]
                out.append((name, info["dtype"], info["shape"], data[a:b]))
    return out


def _rewrite(src: Path, dst: Path, tensors: list, shards: int, stem: str) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    weight_map = {}
    for i in range(shards):
        part = tensors[i::shards]
        name = f"{stem}-{i}.safetensors"
        _write(dst / name, part)
        weight_map.update({t[0]: name for t in part})
    total = sum(len(t[3]) for t in tensors)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    return dst


def _summary(mtp) -> tuple:
    return ({e: (v.verdict, tuple(sorted(v.reasons)), v.layers_used) for e, v in mtp.verdicts.items()},
            mtp.present_layers, mtp.tensors, mtp.bytes, mtp.complete,
            tuple((l.k, l.prefix, l.missing, l.experts_present, l.experts_expected) for l in mtp.layers))


@pytest.mark.parametrize("name", ["qwen3_5_moe_mtp_incomplete", "deepseek_v3_nvfp4_mtp_fp4", "mimo_v2_flash"])
def test_verdicts_ignore_tensor_order_and_shard_names(report, make_fixture, tmp_path, name):
    src = make_fixture(name)
    tensors = _all_tensors(src)
    shuffled = _rewrite(src, tmp_path / "reversed", list(reversed(tensors)), 5, "weights-part")
    one_file = _rewrite(src, tmp_path / "single", sorted(tensors, key=lambda t: t[0][::-1]), 1, "x")
    base = _summary(report(name).mtp)
    assert _summary(build_report(str(shuffled), progress=False).mtp) == base
    assert _summary(build_report(str(one_file), progress=False).mtp) == base


def _split_grouped_experts(tensors: list, drop_expert: int | None = None) -> list:
    """mtp.layers.0.mlp.experts.{gate_up_proj [E,2I,H], down_proj [E,H,I]} -> per-expert BF16 tensors."""
    out = []
    for name, dtype, shape, blob in tensors:
        if name.startswith("mtp.") and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            assert dtype == "BF16"
            experts, rows, cols = shape
            step = rows * cols * 2
            base = name.rsplit(".", 1)[0]
            for e in range(experts):
                if e == drop_expert:
                    continue
                chunk = blob[e * step:(e + 1) * step]
                if name.endswith("gate_up_proj"):
                    half = len(chunk) // 2
                    out.append((f"{base}.{e}.gate_proj.weight", dtype, [rows // 2, cols], chunk[:half]))
                    out.append((f"{base}.{e}.up_proj.weight", dtype, [rows // 2, cols], chunk[half:]))
                else:
                    out.append((f"{base}.{e}.down_proj.weight", dtype, [rows, cols], chunk))
        else:
            out.append((name, dtype, shape, blob))
    return out


def _shrink_grouped(tensors: list, experts: int) -> list:
    out = []
    for name, dtype, shape, blob in tensors:
        if name.startswith("mtp.") and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            per = len(blob) // shape[0]
            out.append((name, dtype, [experts, *shape[1:]], blob[:per * experts]))
        else:
            out.append((name, dtype, shape, blob))
    return out


def test_verdicts_ignore_expert_storage(report, make_fixture, tmp_path):
    src = make_fixture("qwen3_5_moe_nvfp4_fused")
    tensors = _all_tensors(src)
    per_expert = _rewrite(src, tmp_path / "per_expert", _split_grouped_experts(tensors), 2, "model")
    grouped = report("qwen3_5_moe_nvfp4_fused").mtp
    split = build_report(str(per_expert), progress=False).mtp
    assert _summary(split)[0] == _summary(grouped)[0]
    assert split.layers[0].experts_present == grouped.layers[0].experts_present == 4
    assert split.bytes == grouped.bytes and split.params == grouped.params
    # the same missing expert, in either storage, gives the same verdicts
    short_split = build_report(str(_rewrite(src, tmp_path / "split3", _split_grouped_experts(tensors, 3), 2, "m")),
                               progress=False).mtp
    short_grouped = build_report(str(_rewrite(src, tmp_path / "grouped3", _shrink_grouped(tensors, 3), 2, "m")),
                                 progress=False).mtp
    assert _summary(short_split)[0] == _summary(short_grouped)[0]
    assert short_split.verdicts["vllm"].verdict == "unusable"
    assert "mtp-missing-experts" in short_grouped.verdicts["sglang"].reasons
    assert short_split.layers[0].experts_present == short_grouped.layers[0].experts_present == 3


# --- MTP cost ----------------------------------------------------------------------------------

def test_mtp_cost_against_raw_headers(report, make_fixture):
    r = report("qwen3_5_moe_nvfp4")
    tensors = _all_tensors(make_fixture("qwen3_5_moe_nvfp4"))
    mtp_bytes = sum(len(t[3]) for t in tensors if t[0].startswith("mtp."))
    expert_bytes = sum(len(t[3]) for t in tensors if t[0].startswith("mtp.layers.0.mlp.experts."))
    total = sum(len(t[3]) for t in tensors)
    one = mtp_cost(r.checkpoint, r.mtp, tp=1, ep=1)
    assert one.bytes == mtp_bytes and one.loaded_bytes == mtp_bytes and one.expert_bytes == expert_bytes
    assert one.bytes_per_gpu == mtp_bytes and one.total_bytes_per_gpu == total
    assert one.share_per_gpu == pytest.approx(mtp_bytes / total)
    ep4 = mtp_cost(r.checkpoint, r.mtp, tp=1, ep=4)
    assert ep4.bytes_per_gpu == pytest.approx(mtp_bytes - expert_bytes + expert_bytes / 4, abs=64)
    tp2 = mtp_cost(r.checkpoint, r.mtp, tp=2, ep=2)
    assert tp2.bytes_per_gpu < one.bytes_per_gpu and tp2.total_bytes_per_gpu < one.total_bytes_per_gpu
    from ckptinspect.render.json_out import mtp_cost_json

    assert json.loads(json.dumps(mtp_cost_json(tp2)))["tp"] == 2


def test_mtp_cost_without_mtp_and_bad_parallelism(report):
    from ckptinspect.errors import PlanError

    r = report("llama_bf16")
    cost = mtp_cost(r.checkpoint, r.mtp, tp=2, ep=1)
    assert cost.bytes == cost.bytes_per_gpu == 0 and cost.share_per_gpu == 0.0
    with pytest.raises(PlanError):
        mtp_cost(r.checkpoint, r.mtp, tp=0, ep=1)


def test_runtime_names_and_user_rules(make_fixture, tmp_path):
    """A user rule (new id, extends the built-in) matching exclude lists under engine runtime names:
    DeepSeek-V3.1-NVFP4 style `model.layers.{L}*` covers the checkpoint names but not a runtime
    rename to `model.decoder.` (the sgl-project/sglang PR #34906 situation, D8)."""
    import yaml

    rule = {
        "schema_version": 1, "id": "ds_runtime", "name": "DeepSeek with runtime names", "extends": "deepseek_v3",
        "match": {"architectures": ["DeepseekV3ForCausalLM"]},
        "engines": {"sglang": {
            "draft_quant": [{"result": "inherit"}],
            "runtime_names": [{"from": "model.layers.{L+k}.", "to": "model.decoder."}],
            "defects": [{"code": "exclude-keyed-by-checkpoint-name", "verdict": "unusable",
                         "when": {"bf16_mtp_not_excluded": {"names": "runtime"}},
                         "message": "exclude list misses runtime names: {uncovered}",
                         "reference": "sgl-project/sglang PR #34906"}]}},
    }
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "ds_runtime.yaml").write_text(yaml.safe_dump(rule))
    r = build_report(str(make_fixture("deepseek_v3_nvfp4")), rules_dirs=(tmp_path / "rules",), progress=False)
    mtp = r.mtp
    assert mtp.family == "ds_runtime" and r.checkpoint.family == "ds_runtime"
    sg = mtp.verdicts["sglang"]
    assert sg.verdict == "unusable" and sg.reasons == ("exclude-keyed-by-checkpoint-name",)
    assert "model.layers.3.mlp.experts.{}.down_proj" in next(f.message for f in mtp.findings
                                                         if f.code == "exclude-keyed-by-checkpoint-name")
    assert "mtp-bf16-not-excluded" not in sg.reasons  # names "either": the checkpoint name is covered
    assert mtp.verdicts["vllm"].verdict == "ready"


def test_deepseek_bf16_mtp_without_exclude_entry_differs_per_engine(make_fixture, tmp_path):
    """NVFP4 DeepSeek whose exclude list lost `model.layers.{L}*`: SGLang's NextN builds the layer
    unquantized under modelopt_fp4 whatever the list says (ready); vLLM builds NVFP4 parameters for
    the BF16 tensors (unusable, D6)."""
    src = make_fixture("deepseek_v3_nvfp4")
    dst = copy_with_config(src, tmp_path / "ds_no_mtp_exclude")
    L = json.loads((dst / "config.json").read_text())["num_hidden_layers"]
    hq = json.loads((dst / "hf_quant_config.json").read_text())
    hq["quantization"]["exclude_modules"] = [e for e in hq["quantization"]["exclude_modules"]
                                             if not e.startswith(f"model.layers.{L}")]
    (dst / "hf_quant_config.json").write_text(json.dumps(hq))
    mtp = build_report(str(dst), progress=False).mtp
    assert mtp.verdicts["sglang"].verdict == "ready" and mtp.verdicts["sglang"].draft_quantization is None
    assert mtp.verdicts["vllm"].verdict == "unusable" and "mtp-bf16-not-excluded" in reasons(mtp, "vllm")
    finding = next(f for f in mtp.findings if f.code == "mtp-bf16-not-excluded")
    assert f"model.layers.{L}.*" in finding.hint
    assert f"model.layers.{L}.eh_proj" not in finding.message  # eh_proj is a plain nn.Linear in both engines


def test_modelopt_mixed_precision_decides_sglang_draft_quant(make_fixture, tmp_path):
    """SGLang's Qwen3.5 MTP keeps modelopt_mixed only when quantized_layers lists mtp.* modules
    (python/sglang/srt/models/qwen3_5_mtp.py _mtp_quant_config)."""
    src = make_fixture("qwen3_5_moe_mtp_partial_quant")
    L = json.loads((src / "config.json").read_text())["text_config"]["num_hidden_layers"]
    main = {f"model.language_model.layers.{i}.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}
            for i in range(L)}
    outcomes = {}
    for label, listed in (("mtp_listed", {**main, "mtp.layers.0.mlp.experts": {"quant_algo": "NVFP4",
                                                                                "group_size": 16}}),
                          ("mtp_unlisted", main)):
        def mixed(cfg, listed=listed):
            q = cfg["quantization_config"]
            q["quant_algo"] = "MIXED_PRECISION"
            q["quantized_layers"] = listed
            q.pop("ignore", None)

        dst = copy_with_config(src, tmp_path / label, mixed)
        (dst / "hf_quant_config.json").unlink()
        outcomes[label] = build_report(str(dst), progress=False).mtp
    listed_sg = outcomes["mtp_listed"].verdicts["sglang"]
    assert listed_sg.draft_quantization is not None  # inherit: the MTP experts stay NVFP4 ...
    # ... and the rest of the draft is built BF16 per module from quantized_layers (the module table shows
    # every module as stored), so no stored-only rule makes it unusable: a 4-bit draft, degraded
    assert "mtp-partial-quant" not in listed_sg.reasons and "mtp-quantized-4bit" in listed_sg.reasons
    unlisted_sg = outcomes["mtp_unlisted"].verdicts["sglang"]
    assert unlisted_sg.draft_quantization is None
    assert "mtp-quantized-but-built-unquantized" in unlisted_sg.reasons
