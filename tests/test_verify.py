"""`ckptinspect verify`: the MTP draft dry-loaded through vLLM's own code (CPU build 0.32.0, the engine test
environment of tests/vllm_engine.py), in the engine's own Python, from headers only.

The checkpoints are sparse replicas at DeepSeek-V3's real dimensions (fixtures/replica.py: block-FP8,
the MTP layer at model.layers.{L}); tiny fixtures would not do, since 128x128 scale blocks do not tile
their dimensions and vLLM rightly refuses them. Each defect is written into a copy of the stored layout
and must be found by the engine's load or by the instrumented loaders, never by ckptinspect's rules:
- a routed expert stored BF16 where vLLM built FP8 (meta ``copy_`` would accept it silently);
- one expert's weight_scale_inv missing (the fused parameter still counts as loaded for vLLM);
- no MTP tensors at all (vLLM 0.32.0's own completeness check raises: model_executor/models/deepseek_mtp.py).
All variants run in ONE engine process (``verify_many``). The environment problems (no interpreter, an
interpreter without vLLM, a crashing one, one past the deadline) need no engine and are one line, exit 2.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
STUB = {"CKPTINSPECT_VERIFY_STUB_MISSING": "torchvision"}  # the test environment removed CUDA torchvision


def _engine_python() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_engine import engine_python

    return engine_python()


def _deepseek(tmp: Path, name: str, mutate=None) -> Path:
    """A DeepSeek-V3 block-FP8 replica, 4 layers (3 dense + 1 MoE), 8 experts, MTP at model.layers.4."""
    from fixtures.replica import replica_tensors
    from fixtures.spec import DATA_DIR, dump_json, place
    from fixtures.writer import write_sparse_checkpoint

    config = json.loads((DATA_DIR / "deepseek-ai__DeepSeek-V3__config.json").read_text(encoding="utf-8"))
    config.update(num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=8)
    tensors = replica_tensors(config)
    if mutate is not None:
        tensors = mutate(tensors)
    write_sparse_checkpoint(tmp / name, dump_json(config), place(tensors, 3))
    return tmp / name


def _bf16_expert(tensors):
    name = "model.layers.4.mlp.experts.5.down_proj.weight"
    return [replace(t, dtype="BF16") if t.name == name else t for t in tensors]


def _missing_scale(tensors):
    return [t for t in tensors if t.name != "model.layers.4.mlp.experts.2.up_proj.weight_scale_inv"]


def _no_mtp(tensors):
    return [t for t in tensors if not t.mtp]


def sglang_environment() -> tuple[str, str]:
    """(python, PYTHONPATH) of the SGLang 0.5.23 test install (tests/sglang_parser.py, sglang_quant_oracle.py):
    a pip --target install used with this Python."""
    from tests.sglang_parser import ensure_sglang
    from tests.sglang_quant_oracle import ensure_quant_deps

    return sys.executable, os.pathsep.join([str(ensure_sglang()), str(ensure_quant_deps())])


@pytest.fixture(scope="module")
def sglang_dryloads(tmp_path_factory):
    from ckptinspect.verify import verify_many

    python, path = sglang_environment()
    tmp = tmp_path_factory.mktemp("verify-sglang")
    from fixtures.generate import build_fixture

    from tests.test_verify_vs_rules import _deepseek_v31_nvfp4

    refs = [_deepseek(tmp, "as-stored"), _deepseek(tmp, "bf16-expert", _bf16_expert),
            _deepseek(tmp, "missing-scale", _missing_scale),
            build_fixture("qwen3_5_moe_ct_nvfp4a16_mtp_experts", tmp), _deepseek_v31_nvfp4(tmp, "v3.1-nvfp4")]
    start = time.perf_counter()
    results = verify_many([str(r) for r in refs], "sglang", engine_python=python, engine_pythonpath=path,
                          deadline=900)
    print(f"\nverify: 3 DeepSeek-V3 replicas, a DeepSeek-V3.1 NVFP4 copy and a Qwen3.5 export dry-loaded by "
          f"SGLang in one process: {time.perf_counter() - start:.1f} s")
    return dict(zip(("as-stored", "bf16-expert", "missing-scale", "qwen3.5-nvfp4a16", "v3.1-nvfp4"), results))


def test_sglang_as_stored_loads_with_its_own_nextn_draft(sglang_dryloads):
    result = sglang_dryloads["as-stored"]
    assert not isinstance(result, str), result
    assert result.outcome == "loads", [s for s in result.steps if not s.ok]
    assert (result.engine_version, result.draft_class, result.quant_config) == \
        ("0.5.23", "DeepseekV3ForCausalLMNextN", "Fp8Config")
    params = _params(result)
    assert params["model.decoder.mlp.experts.w13_weight"].dtype == "float8_e4m3fn"
    # the fused q_a / kv_a projection is loaded from BOTH stored tensors (SGLang concatenates them first)
    fused = params["model.decoder.self_attn.fused_qkv_a_proj_with_mqa.weight"]
    assert fused.status == "loaded" and fused.source_count == 2
    assert params["lm_head.weight"].status == "shared" and params["model.embed_tokens.weight"].status == "shared"
    # SGLang's NextN loader skips the MTP layer's own head and embedding: the target's are used
    assert set(result.mtp_tensors_skipped) == {"model.layers.4.embed_tokens.weight",
                                               "model.layers.4.shared_head.head.weight"}


def test_sglang_finds_the_same_defects(sglang_dryloads):
    bf16 = _params(sglang_dryloads["bf16-expert"])["model.decoder.mlp.experts.w2_weight"]
    assert sglang_dryloads["bf16-expert"].outcome == "defects" and bf16.status == "mismatch"
    scale = _params(sglang_dryloads["missing-scale"])["model.decoder.mlp.experts.w13_weight_scale_inv"]
    assert scale.problems == ("1 of 16 (shard, expert) slots never loaded: expert 2 w3",)


def test_sglang_nextn_head_scales_are_unused_once_the_target_head_is_shared(sglang_dryloads):
    """nvidia's DeepSeek-V3.1 NVFP4 layout: SGLang 0.5.23 builds the NextN lm_head with the NVFP4 linear
    method (the exclude list does not name model.shared_head.head), and set_embed_and_head gives it the
    target's BF16 head; its logits processor then skips the stale method
    (should_apply_lm_head_quant_method), so the method's scales are never read: unused, and the draft loads."""
    result = sglang_dryloads["v3.1-nvfp4"]
    assert not isinstance(result, str), result
    assert result.outcome == "loads", [(m.module, p.name, p.status) for m in result.modules for p in m.parameters
                                       if p.status in ("mismatch", "never loaded")]
    params = _params(result)
    assert (params["lm_head.weight"].dtype, params["lm_head.weight"].status) == ("uint8", "shared")
    for leaf in ("weight_scale", "weight_scale_2", "input_scale"):
        param = params[f"lm_head.{leaf}"]
        assert param.status == "unused" and param.calls == 0, param
        assert "bfloat16" in param.note and "should_apply_lm_head_quant_method" in param.note
    # the FP8 replica's head is unquantized: nothing of it is unused
    assert not any(p.status == "unused" for p in _params(sglang_dryloads["as-stored"]).values())


def test_sglang_builds_a_hybrid_qwen35_draft_per_module_as_stored(sglang_dryloads):
    """Qwen3.5 (linear attention + MoE) weight-only NVFP4 export whose MTP experts are NVFP4 and the rest of
    the MTP layer BF16: SGLang 0.5.23 builds the NextN experts NVFP4 from the ignore list, module by module,
    and every stored MTP tensor loads (no one-scheme-for-the-whole-draft failure). On CPU the dry-load runs
    without the radix cache, whose Mamba extra-buffer check refuses a machine without CUDA."""
    result = sglang_dryloads["qwen3.5-nvfp4a16"]
    assert not isinstance(result, str), result
    assert result.outcome == "loads", [s for s in result.steps if not s.ok]
    params = _params(result)
    experts = params["model.layers.0.mlp.experts.w13_weight_packed"]
    assert (experts.dtype, experts.status) == ("uint8", "loaded")
    assert params["model.layers.0.qkv_proj.weight"].dtype == "bfloat16"
    assert not result.mtp_tensors_skipped or all(".experts." not in n for n in result.mtp_tensors_skipped)
    assert any("disable_radix_cache" in s for s in result.shims)


@pytest.fixture(scope="module")
def dryloads(tmp_path_factory):
    from ckptinspect.verify import verify_many

    python = _engine_python()
    tmp = tmp_path_factory.mktemp("verify")
    refs = [_deepseek(tmp, "as-stored"), _deepseek(tmp, "bf16-expert", _bf16_expert),
            _deepseek(tmp, "missing-scale", _missing_scale), _deepseek(tmp, "no-mtp", _no_mtp)]
    os.environ.update(STUB)
    start = time.perf_counter()
    try:
        results = verify_many([str(r) for r in refs], "vllm", engine_python=python, deadline=900)
    finally:
        for key in STUB:
            os.environ.pop(key, None)
    print(f"\nverify: 4 DeepSeek-V3 replicas dry-loaded by vLLM in one process: {time.perf_counter() - start:.1f} s")
    return dict(zip(("as-stored", "bf16-expert", "missing-scale", "no-mtp"), results))


def _params(result):
    return {f"{m.module}.{p.name}": p for m in result.modules for p in m.parameters}


def test_as_stored_loads_with_the_engines_own_draft(dryloads):
    result = dryloads["as-stored"]
    assert not isinstance(result, str), result
    assert result.outcome == "loads", [s for s in result.steps if not s.ok]
    assert (result.engine_version, result.draft_class, result.quant_config) == ("0.32.0", "DeepSeekMTP", "Fp8Config")
    params = _params(result)
    assert len(params) == 28  # the draft vLLM 0.32.0 builds for DeepSeek-V3 (one MTP layer)
    expert = "model.layers.4.mtp_block.mlp.experts.routed_experts"
    assert params[f"{expert}.w13_weight"].dtype == "float8_e4m3fn"
    assert params[f"{expert}.w13_weight"].shape == (8, 4096, 7168)
    assert params["model.layers.4.eh_proj.weight"].dtype == "bfloat16"  # vLLM builds it unquantized
    assert params[f"{expert}.w13_weight"].calls == 16  # 8 experts x (gate, up)
    assert result.mtp_tensors_skipped == ()
    assert {p.status for p in params.values()} <= {"loaded", "shared"}
    assert any("AMX" in shim for shim in result.shims)  # the platform shim is named


def test_bf16_into_fp8_parameter_is_a_mismatch(dryloads):
    result = dryloads["bf16-expert"]
    param = _params(result)["model.layers.4.mtp_block.mlp.experts.routed_experts.w2_weight"]
    assert result.outcome == "defects"
    assert param.status == "mismatch"
    assert any("experts.5.down_proj.weight stored bfloat16 loaded into a float8_e4m3fn parameter" in p
               for p in param.problems), param.problems


def test_one_missing_expert_scale_is_found(dryloads):
    result = dryloads["missing-scale"]
    param = _params(result)["model.layers.4.mtp_block.mlp.experts.routed_experts.w13_weight_scale_inv"]
    assert result.outcome == "defects"
    assert param.status == "mismatch"
    assert param.problems == ("1 of 16 (shard, expert) slots never loaded: expert 2 w3",)


def test_no_mtp_tensors_is_the_engines_own_exception(dryloads):
    result = dryloads["no-mtp"]
    failed = [s for s in result.steps if not s.ok]
    assert result.outcome == "load failed"
    assert failed[0].step == "load weights"
    assert "MTP speculative decoding layer 4 weights missing from checkpoint" in failed[0].error
    assert failed[0].where.startswith("vllm/model_executor/models/deepseek_mtp.py:")


def test_cli_json_validates_and_text_names_the_version(tmp_path):
    from ckptinspect.render.verify_out import validate_verify_json

    ref = _deepseek(tmp_path, "cli")
    done = run_cli("verify", str(ref), "--engine", "vllm", "--engine-python", _engine_python(), "--format", "json",
                   env=STUB, timeout=900)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    validate_verify_json(doc)
    assert doc["engine_version"] == "0.32.0" and doc["outcome"] == "loads"


# -- the environment: one line, exit 2, bounded time ------------------------------------------------------
def _fake_python(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("case", ["missing", "no-engine", "crashes", "hangs"])
def test_a_missing_or_broken_engine_environment_is_one_line(case, tmp_path, make_fixture):
    ref = str(make_fixture("deepseek_v3_fp8"))
    python = {"missing": str(tmp_path / "nowhere" / "python"),
              "no-engine": sys.executable,  # ckptinspect's own environment has no vLLM
              "crashes": _fake_python(tmp_path, "crashing-python", "echo 'Segmentation fault' >&2; exit 139"),
              "hangs": _fake_python(tmp_path, "hanging-python", "exec sleep 60")}[case]
    start = time.perf_counter()
    done = run_cli("verify", ref, "--engine", "vllm", "--engine-python", python, "--deadline", "3", timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert time.perf_counter() - start < 30
    expected = {"missing": "no executable Python interpreter", "no-engine": "vllm cannot be imported",
                "crashes": "gave no answer (exit 139: Segmentation fault)", "hangs": "did not answer within 3 s"}
    assert expected[case] in lines[0]


def test_default_engine_python_without_the_engine_is_one_line(make_fixture):
    done = run_cli("verify", str(make_fixture("deepseek_v3_fp8")), "--engine", "sglang", timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "sglang is not installed in this Python" in done.stderr
