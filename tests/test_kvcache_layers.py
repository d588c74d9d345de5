"""The one KV-cache model (plan/kvcache.py) per layer: ``layer_kv_bytes`` summed over a checkpoint's layers
is ``kv_cost``'s request bytes for every attention kind (MLA, DSA, DeepSeek-V4 compressed, GQA, sliding
window, hybrid linear), and the llama.cpp plan (plan/llamacpp.py) takes its KV bytes from it, so a
sliding-window GGUF caches at most its window per layer."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from plan_checkpoints import GLM_5, deepseek_v3_fp8, glm_5_fp8, qwen3_next_80b  # noqa: E402

from ckptinspect.config.normalize import normalize_config  # noqa: E402

from ckptinspect.pipeline import build_report  # noqa: E402
from ckptinspect.plan.kvcache import kv_cost, layer_kv_bytes  # noqa: E402
from ckptinspect.plan.llamacpp import KV_DTYPE, plan_llamacpp  # noqa: E402


def _summed(ck, context: int, kv_dtype: str, tp: int, extra: int = 0) -> float:
    layers = ck.config.num_hidden_layers + extra
    return sum(layer_kv_bytes(ck, layer, context, kv_dtype, tp) for layer in range(layers))


def _deepseek_v4():
    """A compressed-cache (DeepSeek-V4 style) MLA checkpoint, as tests/test_plan_solver.py builds it."""
    ratios = [4, 128] * 20 + [0, 0, 1]
    raw = {**json.loads(json.dumps(GLM_5)), "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
           "compress_ratios": ratios, "window_size": 128, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64,
           "num_hidden_layers": len(ratios)}
    raw.pop("index_topk")
    return dataclasses.replace(deepseek_v3_fp8(), config=normalize_config(raw))


def _fixture_checkpoints(make_fixture) -> dict[str, object]:
    names = ["deepseek_v4_flash", "gpt_oss_mxfp4", "gemma4", "qwen3_5_moe_nvfp4", "llama_bf16", "glm_moe_dsa"]
    return {name: build_report(str(make_fixture(name)), progress=False).checkpoint for name in names}


@pytest.mark.parametrize("context", [1, 4096, 100_000])
@pytest.mark.parametrize("tp", [1, 8])
def test_layers_sum_to_the_request_cost(make_fixture, context, tp):
    checkpoints = {"deepseek_v3": deepseek_v3_fp8(), "glm_5": glm_5_fp8(), "qwen3_next": qwen3_next_80b(),
                   "deepseek_v4": _deepseek_v4(),
                   **_fixture_checkpoints(make_fixture)}
    models = set()
    for name, ck in checkpoints.items():
        for kv_dtype, extra in (("bf16", 0), ("fp8_e4m3", 0), ("bf16", 1)):
            cost = kv_cost(ck, tp, kv_dtype, extra)
            models.add(cost.model)
            want = cost.request_bytes(context)
            if cost.model == "sliding_window":  # SGLang's SWA pool: swa_ratio x the full tokens, per layer the window
                want = context * cost.per_token + min(context, cost.window) * cost.window_bytes_per_token
            assert _summed(ck, context, kv_dtype, tp, extra) == pytest.approx(want, rel=1e-12), (name, kv_dtype, extra)
    assert {"mla", "dsa", "dsv4_compressed", "gqa", "sliding_window", "hybrid_linear"} <= models


def test_the_llamacpp_plan_caches_a_sliding_window_layer_up_to_its_window(tmp_path):
    pytest.importorskip("gguf")
    from fixtures.gguf_models import MODEL_DIRS, build

    build(tmp_path, ["GLM-4.5-Air-plain-Q4_K_M"])
    report = build_report(str(tmp_path / MODEL_DIRS["GLM-4.5-Air-plain-Q4_K_M"]), progress=False)
    ck = report.checkpoint
    layers = ck.config.num_hidden_layers
    full = plan_llamacpp(ck, report.mtp, gpu="h200", gpus=1, context=65536)
    window = dataclasses.replace(ck.config, layer_types=("sliding_attention",) * layers, sliding_window=1024)
    swa = plan_llamacpp(dataclasses.replace(ck, config=window), report.mtp, gpu="h200", gpus=1, context=65536)
    assert full.gpu_layers == swa.gpu_layers == full.total_layers
    per_token = layer_kv_bytes(ck, 0, 1, KV_DTYPE)
    assert full.kv_bytes == int(per_token * 65536 * layers)
    assert swa.kv_bytes == int(per_token * 1024 * layers) < full.kv_bytes
