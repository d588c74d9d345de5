"""Every generated SGLang command is parsed by SGLang 0.5.23's own argument parser.

tests/sglang_parser.py installs sglang==0.5.23 without dependencies plus the packages its
server_args module imports (once, cached) and runs `ServerArgs.add_cli_args` in a subprocess.
The vLLM commands of the same plans go through vLLM's own parser in tests/test_plan_vllm_parser.py.
"""

from __future__ import annotations

import pytest

from ckptinspect.plan import make_plan
from ckptinspect.plan.rules import engine_rules
from plan_checkpoints import deepseek_v3_fp8, glm_4_5_fp8, glm_5_fp8, mtp_ready, qwen3_next_80b
from sglang_parser import parse_with_sglang

GPUS = ["rtx-pro-6000", "b200", "b300", "h200", "h100", "h20", "gb200", "l40s", "a100", "mi300x", "mi355x",
        "dgx-spark"]


@pytest.fixture(scope="session")
def qwen35(qwen35_report):
    """The full-scale nvidia/Qwen3.5-397B-A17B-NVFP4 layout (94 sparse shards) read by the real pipeline."""
    return qwen35_report.checkpoint, qwen35_report.mtp


@pytest.fixture(scope="session")
def plans(qwen35, report) -> list:
    out = []
    cases = [(qwen35[0], qwen35[1]), (deepseek_v3_fp8(), mtp_ready()), (glm_4_5_fp8(), mtp_ready("NEXTN")),
             (glm_5_fp8(), mtp_ready("NEXTN")), (qwen3_next_80b(), mtp_ready("NEXTN"))]
    for ck, mtp in cases:
        for gpu in GPUS:
            for goal in ("latency", "throughput"):
                try:
                    out.append(make_plan(ck, mtp, gpu=gpu, gpus=8, goal=goal))
                except Exception as exc:  # an impossible fit on small cards is expected
                    assert "does not run" in str(exc), exc
    # Probe-driven tree drafting (topk > 1) swaps the attention backend; SGLang must accept that too.
    probe = {"recommendation": {"sglang": {"num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}}}
    for gpu in ("b200", "rtx-pro-6000", "h200"):
        out.append(make_plan(qwen35[0], qwen35[1], gpu=gpu, gpus=8, probe_report=probe))
    # Solver output (reduced context, raised --mem-fraction-static, --chunked-prefill-size), idle GPUs and
    # max-context on request must parse too.
    out.append(make_plan(qwen35[0], qwen35[1], gpu="h200", gpus=3))
    out.append(make_plan(qwen35[0], qwen35[1], gpu="rtx-pro-6000", gpus=8, max_context=True, concurrency=16))
    out.append(make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="rtx-pro-6000", gpus=8, goal="throughput"))
    # A DeepSeek-V4 release bundling a DSpark draft (dspark_* keys, stages under mtp.*): SGLang's DSPARK and
    # vLLM's dspark method, each with only what the engine does not resolve itself.
    dspark = report("deepseek_v4_flash_dspark")
    out.append(make_plan(dspark.checkpoint, dspark.mtp, gpu="h200", gpus=8))
    assert len(out) >= 30
    return out


@pytest.fixture(scope="session")
def sglang_parsed(plans) -> dict:
    return parse_with_sglang([p.commands["sglang"].args() for p in plans])


def test_sglang_parser_accepts_every_generated_command(plans, sglang_parsed) -> None:
    for plan, result in zip(plans, sglang_parsed["results"]):
        assert result["ok"], f"{plan.model} on {plan.gpu.name}: {result.get('error')}"
        values = result["values"]
        flags = {f.flag: f.value for f in plan.commands["sglang"].flags}
        assert values["tp_size"] == int(flags["--tp-size"])
        if "--moe-runner-backend" in flags:
            assert values["moe_runner_backend"] == flags["--moe-runner-backend"]
        if "--speculative-moe-runner-backend" in flags:
            assert values["speculative_moe_runner_backend"] == flags["--speculative-moe-runner-backend"]
        if "--chunked-prefill-size" in flags:
            assert values["chunked_prefill_size"] == int(flags["--chunked-prefill-size"])
        assert values["context_length"] == plan.context


def test_dspark_release_gets_the_dspark_algorithm_alone(plans, sglang_parsed) -> None:
    """SG:arg_groups/speculative_hook.py _handle_dspark resolves steps / topk / draft tokens from the checkpoint
    (a draft-token count other than block size + 1 is a ValueError there), so the plan names only DSPARK."""
    found = [(p, r) for p, r in zip(plans, sglang_parsed["results"]) if (p.speculative.get("sglang") or {}).get("algorithm") == "DSPARK"]
    assert len(found) == 1
    plan, result = found[0]
    flags = {f.flag: f.value for f in plan.commands["sglang"].flags}
    assert result["ok"], result.get("error")
    assert result["values"]["speculative_algorithm"] == "DSPARK"
    assert result["values"]["speculative_num_draft_tokens"] is None
    assert "--speculative-num-steps" not in flags and "--speculative-num-draft-tokens" not in flags


def test_sglang_parser_rejects_what_it_does_not_know(sglang_parsed) -> None:
    # The harness must be able to fail: a renamed flag and an unknown choice are refused.
    bad = parse_with_sglang([["--model-path", "m", "--mamba-scheduler-strategy", "no_buffer"],
                             ["--model-path", "m", "--attention-backend", "fa5"]])
    assert [r["ok"] for r in bad["results"]] == [False, False]


def test_rule_values_are_sglang_choices(sglang_parsed) -> None:
    choices = sglang_parsed["choices"]
    for name, setting in engine_rules("sglang")["settings"].items():
        flag = setting["flag"]
        if setting.get("boolean"):
            continue
        known = choices.get(flag)
        assert known is not None, f"{flag} has no choices in SGLang 0.5.23"
        values = [p["value"] for p in setting["picks"] if p["value"] is not None]
        values += [b["value"] for b in setting.get("bad", [])]
        values += [a["value"] for key in ("auto", "alternatives") for a in setting.get(key, [])]
        values += [v for vs in setting.get("valid", {}).values() for v in vs]
        unknown = sorted(set(values) - set(known))
        assert not unknown, f"{flag}: {unknown} are not SGLang 0.5.23 choices"
    for entry in engine_rules("sglang")["parsers"]:
        for key, flag in (("reasoning", "--reasoning-parser"), ("tool", "--tool-call-parser")):
            if entry[key]:
                assert entry[key] in choices[flag], f"{flag} {entry[key]}"


def test_solver_and_draft_rule_values_are_sglang_choices(plans, sglang_parsed) -> None:
    choices = sglang_parsed["choices"]
    draft = engine_rules("sglang")["draft"]
    runners = {v for per_arch in draft["runs"].values() for vs in per_arch.values() for v in vs}
    runners |= set(draft["fallback"].values())
    assert runners and runners <= set(choices["--speculative-moe-runner-backend"])
    for cand in engine_rules("sglang")["max_context"]["candidates"]:
        if "kv_cache_dtype" in cand["change"]:
            assert cand["change"]["kv_cache_dtype"] in choices["--kv-cache-dtype"]
    fp8 = engine_rules("sglang")["kv_fp8_backends"]
    assert set(fp8["mla"]) | set(fp8["other"]) <= set(choices["--attention-backend"])
    # The plans above include a solver-reduced context and a draft runner flag.
    assert any(p.solution and p.solution.chosen.id != "defaults" for p in plans)
    assert any("--speculative-moe-runner-backend" in {f.flag for f in p.commands["sglang"].flags} for p in plans)


def test_data_parallel_replica_note_parses() -> None:
    import re

    plan = make_plan(qwen3_next_80b(), mtp_ready("NEXTN"), gpu="b300", gpus=3, engine="sglang")
    note = next(n.message for n in plan.notes if "data-parallel replicas" in n.message)
    dp, tp = re.search(r"--dp-size (\d+) --tp-size (\d+)", note).groups()
    result = parse_with_sglang([["--model-path", "m", "--dp-size", dp, "--tp-size", tp]])["results"][0]
    assert result["ok"] and result["values"]["dp_size"] == int(dp) and result["values"]["tp_size"] == int(tp)


def test_speculative_algorithm_is_registered(plans) -> None:
    algorithms = engine_rules("sglang")["speculative"]["algorithms"]
    seen = {f.value for p in plans for f in p.commands["sglang"].flags if f.flag == "--speculative-algorithm"}
    assert seen and seen <= set(algorithms)
