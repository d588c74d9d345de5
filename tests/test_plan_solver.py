"""A plan that finds a way: failed plans as report sections, the max-context solver, idle GPUs,
KV models per attention kind, draft-side flags and rule conditions that never read the typed name."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import pytest

from ckptinspect.config.normalize import normalize_config
from ckptinspect.plan import PlanFailure, make_plan, plan_or_failure, weights_per_gpu
from ckptinspect.plan.backends import arch_class
from ckptinspect.plan.kvcache import kv_cost
from ckptinspect.plan.rules import engine_rules
from ckptinspect.plan.solver import longest_context
from ckptinspect.render.plan_json import plan_json
from ckptinspect.plan.speculative import draft_expert_kind
from plan_checkpoints import GLM_5, deepseek_v3_fp8, glm_4_5_fp8, glm_5_fp8, mtp_ready, qwen3_next_80b

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "ckptinspect" / "plan" / "plan.schema.json").read_text())
GIB = 2**30
MATRIX_GPUS = ("rtx-pro-6000", "b200", "h200")


def _flags(plan, engine: str = "sglang") -> dict[str, str | None]:
    return {f.flag: f.value for f in plan.commands[engine].flags}


@pytest.fixture(scope="module")
def layouts(qwen35_report) -> dict:
    return {"qwen3.5-397b-nvfp4": (qwen35_report.checkpoint, qwen35_report.mtp),
            "deepseek-v3-fp8": (deepseek_v3_fp8(), mtp_ready()),
            "glm-5-fp8": (glm_5_fp8(), mtp_ready("NEXTN")),
            "qwen3-next-80b": (qwen3_next_80b(), mtp_ready("NEXTN"))}


@pytest.fixture(scope="module")
def matrix(layouts) -> dict:
    return {(name, gpu): plan_or_failure(ck, mtp, gpu=gpu, gpus=8)
            for name, (ck, mtp) in layouts.items() for gpu in MATRIX_GPUS}


def test_every_full_scale_layout_gets_a_command_or_numbers_showing_weights_do_not_fit(matrix, layouts) -> None:
    for (name, gpu), result in matrix.items():
        jsonschema.validate(plan_json(result), SCHEMA)
        if isinstance(result, PlanFailure):
            # The explanation carries the numbers: weights per GPU above the largest static pool.
            weights, pool = map(float, re.search(r"weights take ([\d.]+) GiB .* is ([\d.]+) GiB", result.reason).groups())
            assert weights > pool, (name, gpu, result.reason)
            ck, _ = layouts[name]
            gpu_gib = result.gpu.memory_gib
            assert weights_per_gpu(ck, 8, 1, with_mtp=False) / GIB > pool and pool < gpu_gib
            continue
        assert "python -m sglang.launch_server" in result.commands["sglang"].shell()
        assert result.context >= engine_rules("sglang")["max_context"]["min_context"]
    failures = {k for k, v in matrix.items() if isinstance(v, PlanFailure)}
    # Only GLM-5-FP8 (744B FP8, ~88 GiB of weights per GPU) cannot run on 8x 95.6 GiB.
    assert failures == {("glm-5-fp8", "rtx-pro-6000")}


def test_deepseek_v3_fp8_on_8x_rtx_pro_6000_runs_at_a_reduced_context(matrix) -> None:
    plan = matrix[("deepseek-v3-fp8", "rtx-pro-6000")]
    sol = plan.solution
    assert sol is not None and sol.chosen is not None and sol.chosen.id != "defaults"
    assert 4096 <= plan.context < plan.requested_context == 163840
    f = _flags(plan)
    assert f["--context-length"] == str(plan.context) and f["--max-running-requests"] == "1"
    assert float(f["--mem-fraction-static"]) > 0.80  # above the SM120 field cap, with the risk stated
    assert "max-context solver" in plan.commands["sglang"].flags[[x.flag for x in plan.commands["sglang"].flags]
                                                                  .index("--mem-fraction-static")].reason
    assert any("context reduced to" in n.message and "risk:" in n.message for n in plan.notes)
    # MTP is kept: dropping it is the last resort, only when nothing else runs.
    assert "--speculative-algorithm" in f and sol.chosen.spec
    # Maximality: one more token per request no longer fits the same pool.
    step = sol.chosen
    assert step.cost.request_bytes(plan.context) <= step.budget_bytes < step.cost.request_bytes(plan.context + 1)
    # Triton MLA on SM120 has no FP8 KV, so that candidate is skipped with the reason.
    fp8 = next(s for s in sol.steps if s.id == "fp8-kv-cache")
    assert "no FP8 KV cache" in fp8.skipped and "--kv-cache-dtype" not in f
    # vLLM gets the same context and the raised share, with the caveat that it profiles activations itself.
    vf = _flags(plan, "vllm")
    assert vf["--max-model-len"] == str(plan.context) and float(vf["--gpu-memory-utilization"]) > 0.80
    assert any("check_enough_kv_cache_memory" in c for c in plan.commands["vllm"].caveats)


def test_glm_5_fp8_on_8x_rtx_pro_6000_explains_by_how_much(matrix) -> None:
    result = matrix[("glm-5-fp8", "rtx-pro-6000")]
    assert isinstance(result, PlanFailure)
    assert result.solution is not None and result.solution.chosen is None
    assert result.solution.shortfall_bytes > 0
    assert "needs" in result.reason and "GiB more per GPU" in result.reason


def test_glm_4_5_fp8_on_8x_rtx_pro_6000_runs_at_full_context() -> None:
    plan = make_plan(glm_4_5_fp8(), mtp_ready("NEXTN"), gpu="rtx-pro-6000", gpus=8)
    assert plan.context == plan.requested_context and plan.solution is None


def test_max_context_on_request_for_n_concurrent_requests(qwen35_report) -> None:
    ck, mtp = qwen35_report.checkpoint, qwen35_report.mtp
    contexts = []
    for n in (1, 8, 64):
        plan = make_plan(ck, mtp, gpu="rtx-pro-6000", gpus=8, max_context=True, concurrency=n, engine="sglang")
        step = plan.solution.chosen
        assert n * step.cost.request_bytes(plan.context) <= step.budget_bytes
        assert plan.context == plan.requested_context or \
            n * step.cost.request_bytes(plan.context + 1) > step.budget_bytes
        assert _flags(plan)["--max-running-requests"] == str(n)
        contexts.append(plan.context)
    assert contexts[0] >= contexts[1] >= contexts[2] and contexts[2] < contexts[0]


def test_longest_context_is_exact_on_a_linear_cost() -> None:
    from ckptinspect.plan.kvcache import KvCost

    cost = KvCost("gqa", 100.0, 0, 0.0, 1000, "test")
    assert longest_context(1000 + 100 * 500, cost, 1, 10**6) == 500
    assert longest_context(2 * (1000 + 100 * 500), cost, 2, 10**6) == 500
    assert longest_context(999, cost, 1, 10**6) == 0
    assert longest_context(10**9, cost, 1, 4096) == 4096


def test_failed_plan_is_a_section_of_the_report_and_keeps_its_exit_code(cli) -> None:
    plain = cli("report", "--quiet")
    # The tiny example loads at TP 1 (every engine check passes there), so the failure is memory: a
    # 3 GiB card holds no 4096-token request next to SGLang's reserve.
    small = ("--gpu", "rtx-pro-6000", "--gpus", "8", "--gpu-memory", "3")
    proc = cli("report", *small, "--quiet")
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout.startswith(plain.stdout.rstrip("\n").split("\n")[0])  # the report is all there
    assert "Findings" in proc.stdout and "no plan:" in proc.stdout
    assert "is not a multiple of the NVFP4 group 16" in proc.stdout and "TP / EP options:" in proc.stdout
    js = cli("report", *small, "--format", "json", "--quiet")
    doc = json.loads(js.stdout)
    assert doc["plan"]["status"] == "failed" and doc["findings"]
    jsonschema.validate(doc["plan"], SCHEMA)
    md = cli("report", *small, "--format", "markdown", "--quiet")
    assert md.returncode == 0 and "- **no plan**:" in md.stdout and "| 8 | 8 |" in md.stdout
    gate = cli("report", "--gpu", "h200", "--gpus", "4", "--fail-on", "degraded", "--quiet")
    assert gate.returncode == cli("report", "--fail-on", "degraded", "--quiet").returncode


def test_three_h200_plan_on_two_and_say_why_the_third_is_idle(qwen35_report, cli, qwen35_replica) -> None:
    plan = make_plan(qwen35_report.checkpoint, qwen35_report.mtp, gpu="h200", gpus=3)
    assert plan.gpus == 3 and plan.gpus_used == 2 and _flags(plan)["--tp-size"] == "2"
    assert "1 of 3 GPUs stay idle" in plan.idle_reason and "num_attention_heads 32" in plan.idle_reason
    proc = cli("plan", str(qwen35_replica), "--gpu", "h200", "--gpus", "3", "--quiet", "--engine", "sglang")
    assert proc.returncode == 0 and "GPUs used: 2 of 3" in proc.stdout


def test_dsa_indexer_cache_adds_its_bytes_per_layer() -> None:
    ck = glm_5_fp8()
    layers = GLM_5["num_hidden_layers"]
    bf16 = kv_cost(ck, 8, "auto")
    fp8 = kv_cost(ck, 8, "fp8_e4m3")
    indexer = 128 + 128 // 128 * 4  # FP8 index key + one FP32 scale per 128
    assert bf16.model == "dsa" and bf16.per_token == ((512 + 64) * 2 + indexer) * layers
    # FP8 rows: 512 FP8 latent + 4 scales x 4 bytes + 64 rope in BF16, plus the indexer.
    assert fp8.per_token == (512 + 16 + 128 + indexer) * layers
    plain = kv_cost(deepseek_v3_fp8(), 8, "auto")
    assert plain.model == "mla" and plain.per_token == (512 + 64) * 2 * 61


def test_sliding_window_layers_stop_growing_at_the_window() -> None:
    raw = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "data"
                      / "openai__gpt-oss-20b__config.json").read_text())
    cfg = normalize_config(raw)
    ck = dataclasses.replace(deepseek_v3_fp8(), config=cfg)
    cost = kv_cost(ck, 1, "auto")
    assert cost.model == "sliding_window" and cost.window == cfg.sliding_window
    full = sum(1 for t in cfg.layer_types if t == "full_attention")
    sliding = sum(1 for t in cfg.layer_types if t == "sliding_attention")
    per_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    assert cost.per_token == full * per_layer and cost.window_bytes_per_token == sliding * per_layer
    w, ratio = cost.window, engine_rules("common")["kv_models"]["sliding_window"]["swa_full_tokens_ratio"]
    assert cost.swa_ratio == ratio
    # Below the window every layer grows; between window and window / ratio only the full layers grow
    # (the window bounds the sliding layers); beyond, SGLang's SWA pool grows at ratio x the full pool.
    assert cost.request_bytes(w) - cost.request_bytes(w - 100) == 100 * (full + sliding) * per_layer
    assert cost.request_bytes(w + 10) - cost.request_bytes(w) == 10 * full * per_layer
    far = int(w / ratio) + 10_000
    assert cost.request_bytes(far + 1000) - cost.request_bytes(far) == pytest.approx(
        1000 * (full + ratio * sliding) * per_layer)
    assert cost.request_bytes(far) < far * (full + sliding) * per_layer  # still less than unbounded KV


def test_deepseek_v4_compressed_cache() -> None:
    ratios = [4, 128] * 20 + [0, 0, 1]
    raw = {**json.loads(json.dumps(GLM_5)), "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
           "compress_ratios": ratios, "window_size": 128, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64,
           "num_hidden_layers": len(ratios)}
    raw.pop("index_topk")
    ck = dataclasses.replace(deepseek_v3_fp8(), config=normalize_config(raw))
    cost = kv_cost(ck, 8, "auto")
    slot = 448 + 2 * 64 + 8
    assert cost.model == "dsv4_compressed" and cost.window == 128
    low_indexer = 128 // 2 + 128 // 32  # ratio-1 layers carry an FP4 index key
    assert cost.per_token == pytest.approx(20 * (slot / 4 + 132 / 4) + 20 * slot / 128 + (slot + low_indexer))
    assert cost.window_bytes_per_token == slot * len(ratios)
    # A 1M-token request costs far less than uncompressed MLA would.
    assert cost.request_bytes(10**6) < kv_cost(deepseek_v3_fp8(), 8, "auto").request_bytes(10**6) / 3


def test_draft_moe_runner_flag_follows_the_backend_rules(matrix, layouts) -> None:
    runs = engine_rules("sglang")["draft"]["runs"]
    seen = set()
    for (name, gpu), plan in matrix.items():
        if isinstance(plan, PlanFailure) or "--speculative-algorithm" not in _flags(plan):
            continue
        ck, _ = layouts[name]
        draft = draft_expert_kind(ck)
        f = _flags(plan)
        target = f.get("--moe-runner-backend") or "auto"
        valid = runs.get(draft, {}).get(arch_class("sglang", plan.gpu.arch)) if draft != plan.quant_kind else None
        expect = valid is not None and target not in valid
        assert ("--speculative-moe-runner-backend" in f) is expect, (name, gpu, target, draft)
        if expect:
            seen.add((name, gpu))
            why = next(x.reason for x in plan.commands["sglang"].flags if x.flag == "--speculative-moe-runner-backend")
            assert target in why and draft in why
    # The seed case: BF16 MTP experts next to NVFP4 experts on SM120 (flashinfer_cutlass target runner).
    assert ("qwen3.5-397b-nvfp4", "rtx-pro-6000") in seen
    assert ("qwen3.5-397b-nvfp4", "b200") not in seen and ("deepseek-v3-fp8", "rtx-pro-6000") not in seen


def test_vllm_gets_the_draft_note_instead_of_a_draft_field(matrix) -> None:
    plan = matrix[("qwen3.5-397b-nvfp4", "rtx-pro-6000")]
    spec = json.loads(_flags(plan, "vllm")["--speculative-config"])
    assert set(spec) == {"method", "num_speculative_tokens"}
    assert any(n.message.startswith("vllm: vLLM picks the MoE kernel per layer") for n in plan.notes)


def test_rule_conditions_never_read_the_typed_name() -> None:
    base = deepseek_v3_fp8()
    copies = [dataclasses.replace(base, ref=ref, location=ref) for ref in ("deepseek-ai/DeepSeek-R1", "./my-copy",
                                                                             "x/DeepSeek-V3.1")]
    def flags(ck):
        plan = make_plan(ck, mtp_ready(), gpu="h200", gpus=8)
        return {e: [(f.flag, f.value) for f in c.flags if f.flag != "--model-path"] for e, c in plan.commands.items()}
    want = flags(base)
    assert all(flags(ck) == want for ck in copies)
    schema = json.loads((Path(__file__).resolve().parent.parent / "rules" / "schema" / "engine.schema.json").read_text())
    assert "name_regex" not in json.dumps(schema)
    plan = make_plan(base, mtp_ready(), gpu="h200", gpus=8)
    assert any("does not tell DeepSeek-V3 from R1" in n.message for n in plan.notes)


def test_cli_plan_max_context_flag(qwen35_replica, cli) -> None:
    proc = cli("plan", str(qwen35_replica), "--gpu", "rtx-pro-6000", "--gpus", "8", "--max-context", "--concurrency",
               "4", "--format", "json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, SCHEMA)
    assert data["status"] == "ok" and data["max_context"]["concurrency"] == 4
    assert data["context"] == data["max_context"]["max_context"] <= data["requested_context"]
    assert data["commands"]["sglang"]["argv"][data["commands"]["sglang"]["argv"].index("--max-running-requests") + 1] == "4"
    text = cli("plan", str(qwen35_replica), "--gpu", "rtx-pro-6000", "--gpus", "8", "--max-context", "--quiet")
    assert "Longest context for 1 concurrent request(s)" in text.stdout


def test_idle_gpus_suggest_data_parallel_replicas_when_one_replica_fits() -> None:
    plan = make_plan(qwen3_next_80b(), mtp_ready("NEXTN"), gpu="b300", gpus=3)
    assert plan.gpus_used == 2 and plan.min_gpus == 1
    note = next(n.message for n in plan.notes if "data-parallel replicas" in n.message)
    assert "--dp-size 3 --tp-size 1" in note
    # Without a count that divides the GPUs and fits alone, there is no such note.
    big = make_plan(glm_4_5_fp8(), mtp_ready(), gpu="h200", gpus=6)
    assert not any("data-parallel replicas" in n.message for n in big.notes)
