"""GGUF checkpoints through the real report pipeline and CLI: inventory, llama.cpp MTP verdicts, hostile files.

Fixtures are written by ggml's own writer (fixtures/gguf_models.py) with llama.cpp's metadata keys and
tensor names: head inside (Q8_0), heavily quantized head (IQ3_S), head declared but dropped, head in an
``mtp-*.gguf`` companion, no head, a split set, and qwen4exp (Qwen3.8-Flash-Next, heads fail to load).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import report_json, run_cli  # noqa: E402

from ckptinspect.header.gguf import ByteWindow, parse_gguf  # noqa: E402
from ckptinspect.pipeline import build_report  # noqa: E402
from ckptinspect.readiness.gguf_conditions import version_in  # noqa: E402
from ckptinspect.readiness.gguf_mtp import assess_gguf_mtp
from ckptinspect.rules.gguf_engine import gguf_engine_rules  # noqa: E402
from ckptinspect.sources import open_source  # noqa: E402
from fixtures.gguf_models import MODEL_DIRS, MODELS, build  # noqa: E402

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    build(root)
    return {name: root / MODEL_DIRS[name] for name in MODELS}


EXPECTED = {  # model -> (verdict, reason code, present layers)
    "GLM-4.5-Air-Q4_K_M": ("ready", "gguf-mtp-head-inside", 1),
    "GLM-4.5-Air-Q8_0": ("ready", "gguf-mtp-head-inside", 1),
    "GLM-4.5-Air-IQ3_S": ("degraded", "gguf-mtp-head-low-bits", 1),
    "GLM-4.5-Air-noMTP-Q4_K_M": ("unusable", "gguf-mtp-declared-missing", 0),
    "GLM-4.5-Air-trunk-Q4_K_M": ("ready", "gguf-mtp-head-companion", 1),
    "GLM-4.5-Air-plain-Q4_K_M": ("absent", "gguf-no-mtp-head", 0),
    "Qwen3.8-Flash-Next-UD-Q4_K_XL": ("unusable", "llamacpp-head-fails-to-load", 1),
    "Qwen3.6-35B-A3B-MTP-UD-Q4_K_XL": ("ready", "gguf-mtp-head-inside", 1),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_llamacpp_verdict_per_fixture(models, name):
    report = build_report(str(models[name]), progress=False)
    verdict, code, present = EXPECTED[name]
    v = report.mtp.verdicts["llamacpp"]
    assert (v.verdict, v.reasons, report.mtp.present_layers) == (verdict, (code,), present)
    assert report.checkpoint.format == "gguf"
    finding = next(f for f in report.mtp.findings if f.code == code)
    if code == "gguf-mtp-head-companion":
        assert "-md mtp-GLM-4.5-Air-trunk-Q8_0.gguf" in finding.message
    if code == "gguf-mtp-head-low-bits":
        assert "IQ3_S" in finding.message and "measure acceptance" in finding.message
    if code == "llamacpp-head-fails-to-load":
        assert finding.reference == "ggml-org/llama.cpp#29174"


def test_inventory_counts_blocks_layers_experts_and_types(models):
    report = build_report(str(models["GLM-4.5-Air-Q4_K_M"]), progress=False)
    ck = report.checkpoint
    # block_count (4) includes the NextN block: 3 main layers, MTP layer k=0 is blk.3
    assert ck.config.num_hidden_layers == 3 and ck.config.routed_experts == 4
    assert ck.declared.label == "gguf:Q4_K_M"
    header = parse_gguf(ByteWindow((models["GLM-4.5-Air-Q4_K_M"] / "GLM-4.5-Air-Q4_K_M.gguf").read_bytes(),
                                   source="x"))
    assert ck.inventory.totals.tensors == len(header.tensors)
    assert ck.inventory.totals.bytes == sum(t.nbytes for t in header.tensors)
    mtp = ck.inventory.mtp_groups(0)
    assert {g.pattern for g in mtp if ".nextn." in g.pattern} == {
        f"blk.{{}}.nextn.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "embed_tokens", "shared_head_head",
                                               "shared_head_norm")}
    assert all(g.index == 3 for g in mtp)
    assert {g.component for g in mtp if ".nextn.eh_proj" in g.pattern} == {"mtp_fusion"}
    assert ck.inventory.experts_per_layer() == {1: 4, 2: 4}
    matrices = {g.scheme for g in ck.inventory.main_groups() if g.role == "weight" and len(g.shape) > 1
                and g.component != "router"}
    assert matrices == {"Q4_K", "Q6_K"}  # output.weight stays Q6_K in Q4_K_M mixes


def test_json_contract_has_format_and_ggml_schemes(models):
    doc = report_json(models["GLM-4.5-Air-IQ3_S"])
    assert doc["format"] == "gguf"
    assert set(doc["quantization"]["schemes"]) == {"IQ3_S", "Q6_K", "F32"}
    assert doc["mtp"]["verdict"] == {"llamacpp": "degraded"}
    assert doc["mtp"]["engines"]["llamacpp"]["draft_quantization"] == "IQ3_S"
    assert doc["model"]["num_hidden_layers"] == 3


def test_split_set_report_equals_the_single_file_inventory_shape(models):
    split = build_report(str(models["GLM-4.5-Air-Q8_0"]), progress=False)
    assert len(split.checkpoint.inventory.shards) == 3
    names = {g.pattern for g in split.checkpoint.inventory.groups}
    single = build_report(str(models["GLM-4.5-Air-Q4_K_M"]), progress=False)
    assert names == {g.pattern for g in single.checkpoint.inventory.groups}


def test_version_ranges_and_drafted_architectures(models):
    assert version_in("b10795", ">=b9180,<b11058") and not version_in("b11058", ">=b9180,<b11058")
    assert not version_in("b9000", ">=b9180")
    raw = open_source(str(models["GLM-4.5-Air-Q4_K_M"]), progress=False)
    from ckptinspect.pipeline import checkpoint_from_gguf

    ck = checkpoint_from_gguf(raw)
    # before MTP landed (PR #22673, b9180) llama.cpp drafts with no architecture's head
    old = assess_gguf_mtp(ck, raw.parts, raw.companions, version="b9000").verdicts["llamacpp"]
    assert (old.verdict, old.reasons) == ("unusable", ("llamacpp-arch-not-drafted",))
    rules = gguf_engine_rules()
    assert rules["flags"]["spec_type"] == {"flag": "--spec-type", "value": "draft-mtp", "source": rules["flags"]["spec_type"]["source"]}


def _truncated(path: Path, tmp: Path) -> Path:
    out = tmp / "cut.gguf"
    out.write_bytes(path.read_bytes()[:5000])
    return out


HOSTILE_FILES = {
    "truncated": lambda models, tmp: _truncated(models["GLM-4.5-Air-Q4_K_M"] / "GLM-4.5-Air-Q4_K_M.gguf", tmp),
    "huge-counts": lambda models, tmp: _write(tmp, b"GGUF" + struct.pack("<IQQ", 3, 2**62, 2**62)),
    "string-past-file": lambda models, tmp: _write(tmp, b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40 - 1) + b"k"),
    "unknown-type": lambda models, tmp: _write(tmp, b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"k"
                                               + struct.pack("<I", 99)),
    "no-architecture": lambda models, tmp: _write(tmp, b"GGUF" + struct.pack("<IQQ", 3, 0, 0)),
    "nextn-over-block-count": lambda models, tmp: _write(tmp, b"GGUF" + struct.pack("<IQQ", 3, 0, 3)
                                                         + _kv_str("general.architecture", "glm4moe")
                                                         + _kv_u32("glm4moe.block_count", 2)
                                                         + _kv_u32("glm4moe.nextn_predict_layers", 5)),
    "deep-arrays": lambda models, tmp: _write(tmp, b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"k"
                                              + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 200),
}


def _kv_str(key: str, value: str) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IQ", 8, len(value)) + value.encode()


def _kv_u32(key: str, value: int) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", 4, value)


def _write(tmp: Path, data: bytes) -> Path:
    out = tmp / "bad.gguf"
    out.write_bytes(data)
    return out


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_hostile_gguf_is_one_line_and_exit_2(models, tmp_path, case):
    path = HOSTILE_FILES[case](models, tmp_path)
    result = run_cli("report", str(path), "--quiet", timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in result.stderr


def test_fail_on_gates_the_llamacpp_verdict_and_never_passes_silently(models, tmp_path):
    low = str(models["GLM-4.5-Air-IQ3_S"])
    gated = run_cli("report", low, "--fail-on", "degraded", "--quiet")
    assert gated.returncode == 1 and "llamacpp=degraded" in gated.stderr
    assert run_cli("report", str(models["GLM-4.5-Air-Q4_K_M"]), "--fail-on", "degraded", "--quiet").returncode == 0
    wrong = run_cli("report", low, "--fail-on", "degraded", "--engine", "sglang", "--quiet")
    assert wrong.returncode == 2 and "no sglang verdict" in wrong.stderr
    for args in (("report", low, "--tp", "2"), ("snapshot", low, "-o", str(tmp_path / "s.json.gz"))):
        refused = run_cli(*args, "--quiet")
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    from ckptinspect.sources.gguf_local import looks_like_gguf

    assert looks_like_gguf(low) and looks_like_gguf(f"{low}:IQ3_S") and not looks_like_gguf("org/model")


def test_a_separate_draft_model_companion_counts_as_the_head(tmp_path):
    """Gemma 4 ships its MTP drafter as its own GGUF (mtp-*.gguf, loaded with -md): no nextn.* names, another
    architecture string. The trunk below is a gemma4 dense layout in llama.cpp's names; the drafter's
    architecture value is a stand-in (not taken from a real file)."""
    from fixtures.gguf_models import write_gguf

    def block(b: int, wtype: str) -> list:
        return [(f"blk.{b}.attn_norm.weight", (256,), "F32"), (f"blk.{b}.attn_q.weight", (256, 256), wtype),
                (f"blk.{b}.attn_k.weight", (128, 256), wtype), (f"blk.{b}.attn_v.weight", (128, 256), wtype),
                (f"blk.{b}.attn_output.weight", (256, 256), wtype), (f"blk.{b}.ffn_up.weight", (256, 256), wtype),
                (f"blk.{b}.ffn_gate.weight", (256, 256), wtype), (f"blk.{b}.ffn_down.weight", (256, 256), wtype)]

    kv = {"gemma4.block_count": ("u32", 2), "gemma4.embedding_length": ("u32", 256),
          "gemma4.attention.head_count": ("u32", 2), "gemma4.attention.head_count_kv": ("u32", 1),
          "gemma4.context_length": ("u32", 8192), "general.file_type": ("u32", 15)}
    trunk = [("token_embd.weight", (512, 256), "Q4_K"), ("output_norm.weight", (256,), "F32")] + block(0, "Q4_K") + block(1, "Q4_K")
    write_gguf(tmp_path / "gemma-4-31B-it-Q4_K_M.gguf", "gemma4", kv, trunk)
    draft_kv = {"gemma4-assistant.block_count": ("u32", 1), "gemma4-assistant.embedding_length": ("u32", 256)}
    write_gguf(tmp_path / "mtp-gemma-4-31B-it-Q8_0.gguf", "gemma4-assistant", draft_kv, block(0, "Q8_0"))
    report = build_report(str(tmp_path), progress=False)
    v = report.mtp.verdicts["llamacpp"]
    assert (v.verdict, v.reasons, report.mtp.present_layers) == ("ready", ("gguf-mtp-head-companion",), 1)
    assert report.mtp.schemes == {"F32": 1, "Q8_0": 7}
    from ckptinspect import api

    plan = api.plan(str(tmp_path), gpu="h200", gpus=1)
    assert any(f.flag == "-md" and f.value.endswith("mtp-gemma-4-31B-it-Q8_0.gguf") for f in plan.flags)


def test_the_llamacpp_rule_file_is_checked_like_every_rule_file(tmp_path, monkeypatch):
    from ckptinspect.errors import RuleError
    from ckptinspect.rules import gguf_engine
    from ckptinspect.rules import documents

    good = (documents.rules_root() / "engines" / "llamacpp.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "llamacpp.yaml"
    bad.write_text(good.replace("head_below: Q6_K", "head_belwo: Q6_K"))
    result = run_cli("rules", "validate", str(bad))
    assert result.returncode == 2 and "'head_belwo' was unexpected" in result.stderr
    import shutil

    shutil.copytree(documents.rules_root() / "schema", tmp_path / "schema")
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "llamacpp.yaml").write_text(good.replace("quantized to {lowest_type}", "quantized to {lowest_kind}"))
    monkeypatch.setattr(documents, "rules_root", lambda: tmp_path)
    gguf_engine.gguf_engine_rules.cache_clear()
    try:
        with pytest.raises(RuleError, match="unknown placeholder"):
            gguf_engine.gguf_engine_rules()
    finally:
        gguf_engine.gguf_engine_rules.cache_clear()


def test_nextn_tensors_without_the_key_are_mtp_layers_and_unusable(tmp_path):
    from fixtures.gguf_models import metadata, trunk_tensors, write_gguf

    model = MODELS["GLM-4.5-Air-Q4_K_M"]
    kv = metadata(model, nextn=0)
    kv["glm4moe.block_count"] = ("u32", model.block_count)  # the NextN block counted, the key dropped
    write_gguf(tmp_path / "GLM-4.5-Air-undeclared-Q4_K_M.gguf", "glm4moe", kv, trunk_tensors(model))
    report = build_report(str(tmp_path), progress=False)
    assert report.checkpoint.config.num_hidden_layers == 3
    assert {g.mtp_layer for g in report.checkpoint.inventory.groups if g.index == 3} == {0}
    v = report.mtp.verdicts["llamacpp"]
    assert (v.verdict, v.reasons) == ("unusable", ("gguf-nextn-undeclared",))
    assert any(f.code == "gguf-nextn-undeclared" and f.severity == "error" for f in report.mtp.findings)


def test_hybrid_qwen35moe_layers_and_a_head_without_embedding_or_lm_head(models):
    """Qwen3.6 MTP GGUFs: Gated-DeltaNet blocks (ssm_*) with every 4th block attention, and a NextN block with
    only eh_proj / enorm / hnorm / shared_head_norm (the trunk's embedding and head are shared)."""
    report = build_report(str(models["Qwen3.6-35B-A3B-MTP-UD-Q4_K_XL"]), progress=False)
    cfg = report.checkpoint.config
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) and cfg.attention_kind == "hybrid_linear"
    assert report.mtp.present_layers == 1 and report.mtp.layers[0].prefix == "blk.4."
    from ckptinspect.plan.kvcache import _gqa_layer, state_bytes_per_request
    from ckptinspect.plan.llamacpp import KV_DTYPE, plan_llamacpp

    plan = plan_llamacpp(report.checkpoint, report.mtp, gpu="h200", gpus=1, context=8192)
    # KV growing with the context for the one attention layer and the NextN block only; the recurrent
    # layers keep a fixed conv + SSM state whatever the context (plan/kvcache.py's one model)
    per_token = _gqa_layer(report.checkpoint, 1, KV_DTYPE)
    assert per_token > 0
    assert plan.kv_bytes == int(2 * 8192 * per_token + state_bytes_per_request(report.checkpoint, 1))
