"""make_plan acceptance scenarios and edge cases (rules and memory model at full scale)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from ckptinspect.errors import PlanError
from ckptinspect.plan import make_plan
from ckptinspect.render.plan_json import plan_json
from ckptinspect.render.plan_text import render_plan_markdown, render_plan_text
from ckptinspect.plan.rules import engine_rules
from plan_checkpoints import deepseek_v3_fp8, glm_4_5_fp8, mtp_ready

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "ckptinspect" / "plan" / "plan.schema.json").read_text())


@pytest.fixture(scope="session")
def qwen35(qwen35_report):
    """The full-scale nvidia/Qwen3.5-397B-A17B-NVFP4 layout (94 sparse shards) read by the real pipeline."""
    return qwen35_report.checkpoint, qwen35_report.mtp


def _flags(plan, engine: str = "sglang") -> dict[str, str | None]:
    return {f.flag: f.value for f in plan.commands[engine].flags}


def _valid(engine: str, setting: str, cls: str) -> list[str]:
    return engine_rules(engine)["settings"][setting]["valid"][cls]


def _bad(setting: str, arch: str) -> set[str]:
    return {b["value"] for b in engine_rules("sglang")["settings"][setting].get("bad", []) if arch in b["when"].get("arch", [arch])}


def test_qwen35_nvfp4_on_8x_rtx_pro_6000(qwen35) -> None:
    ck, mtp = qwen35
    plan = make_plan(ck, mtp, gpu="rtx-pro-6000", gpus=8)
    f = _flags(plan)
    assert f["--quantization"] == "modelopt_fp4"
    assert f["--moe-runner-backend"] == "flashinfer_cutlass"
    assert f["--fp4-gemm-backend"] in _valid("sglang", "fp4_gemm_backend", "blackwell_rtx")
    assert f["--fp4-gemm-backend"] not in _bad("fp4_gemm_backend", "sm120")
    assert f["--attention-backend"] in _valid("sglang", "attention_backend", "blackwell_rtx")
    assert f["--attention-backend"] not in _bad("attention_backend", "sm120")
    # moe_intermediate_size 1024 / TP 8 = 128 rows per rank: SGLang's FusedMoE divides it, the NVFP4 scale
    # takes 8 columns and the gated CUTLASS path needs a multiple of 64, so no engine check stops plain TP
    # (latency keeps EP off).
    assert (plan.chosen.memory.tp, plan.chosen.memory.ep) == (8, 1)
    assert f["--tp-size"] == "8" and f.get("--ep-size") in (None, "1")
    assert not [c.id for c in plan.chosen.checks if not c.ok]
    assert plan.chosen.fits and plan.chosen.kv.tokens > plan.context
    assert f["--speculative-algorithm"] in ("NEXTN", "EAGLE")
    assert (f["--speculative-num-steps"], f["--speculative-eagle-topk"], f["--speculative-num-draft-tokens"]) == ("3", "1", "4")
    assert "--disable-custom-all-reduce" in f  # PCIe box
    # 397B NVFP4 weights (~222 GiB + BF16 MTP) fit on 4 but not 2 cards of 95.6 GiB.
    assert plan.min_gpus == 4 and plan.min_gpus_reason.startswith("2x")
    # MTP layer is BF16 in this checkpoint and is counted per GPU.
    assert set(plan.mtp_dtypes) == {"bf16"} and plan.chosen.memory.mtp_bytes_per_rank > 0
    vf = _flags(plan, "vllm")
    assert json.loads(vf["--speculative-config"]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert vf["--tensor-parallel-size"] == "8" and "--enable-expert-parallel" not in vf


def test_qwen35_nvfp4_on_8x_b200_uses_sm100_choices(qwen35) -> None:
    ck, mtp = qwen35
    plan = make_plan(ck, mtp, gpu="b200", gpus=8)
    f = _flags(plan)
    assert f["--moe-runner-backend"] == "flashinfer_trtllm"
    assert f["--attention-backend"] == "trtllm_mha"
    # SGLang 0.5.23's own auto (flashinfer_cutedsl on SM100) is kept and said so (test_backend_auto.py)
    assert "--fp4-gemm-backend" not in f
    autos = {a.flag: a for a in plan.commands["sglang"].engine_auto}
    assert autos["--fp4-gemm-backend"].value in _valid("sglang", "fp4_gemm_backend", "blackwell_dc")
    assert f["--kv-cache-dtype"] == "fp8_e4m3"
    assert "--disable-custom-all-reduce" not in f  # NVLink
    assert plan.chosen.mem.cap_reason is None  # the SM120 cap does not apply
    assert plan.min_gpus == 2


def test_qwen35_nvfp4_on_8x_h200_says_no_native_hopper_path(qwen35) -> None:
    ck, mtp = qwen35
    plan = make_plan(ck, mtp, gpu="h200", gpus=8)
    warning = [n for n in plan.notes if n.severity == "warning" and "NVFP4" in n.message]
    assert warning and "no native path" in warning[0].message and "FP8" in warning[0].message
    f = _flags(plan)
    assert f["--fp4-gemm-backend"] == "marlin" and f["--moe-runner-backend"] == "marlin"
    assert "Marlin" in render_plan_text(plan)


def test_deepseek_v3_fp8_mla_tp8_on_h200() -> None:
    plan = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="h200", gpus=8)
    assert (plan.chosen.memory.tp, plan.chosen.memory.ep) == (8, 1)  # 2048 / 8 = 256, block 128 ok
    assert all(c.ok for c in plan.chosen.checks)
    f = _flags(plan)
    assert "--quantization" not in f  # FP8 is auto-detected
    assert f["--attention-backend"] == "fa3"
    assert "--kv-cache-dtype" not in f  # FA3 MLA has no FP8 KV
    # MLA caches one (512 + 64)-wide latent per layer (61 + 1 MTP layer) on every rank, BF16.
    assert plan.chosen.kv.bytes_per_token == (512 + 64) * 62 * 2
    assert plan.min_gpus == 8 and "4x" in plan.min_gpus_reason


def test_glm45_fp8_tp8_fails_block_128_and_ep_fixes_it() -> None:
    plan = make_plan(glm_4_5_fp8(), mtp_ready(), gpu="h200", gpus=8, engine="sglang")
    tp_only = [o for o in plan.options if o.memory.tp == 8 and o.memory.ep == 1][0]
    failed = [c for c in tp_only.checks if not c.ok]
    assert [c.id for c in failed] == ["fp8-block-moe"] and failed[0].fix == "ep"
    assert "192" in failed[0].message and "128" in failed[0].message
    assert plan.chosen.memory.ep == 8 and _flags(plan)["--ep-size"] == "8"
    assert "192" in plan.parallel_reason
    tp4 = [o for o in plan.options if o.memory.tp == 4 and o.memory.ep == 1][0]
    assert tp4.loads  # 1536 / 4 = 384 = 3 x 128


def test_impossible_fit_says_by_how_much() -> None:
    with pytest.raises(PlanError) as err:
        make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="rtx-5090", gpus=8)
    text = str(err.value)
    assert "does not run on 8x RTX-5090" in text and "GiB more per GPU" in text
    assert "smallest that works" in text or "no count" in text


def test_probe_report_overrides_speculative_defaults(qwen35) -> None:
    ck, mtp = qwen35
    probe = {"recommendation": {"sglang": {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3},
                                "vllm": {"num_speculative_tokens": 1}}}
    plan = make_plan(ck, mtp, gpu="b200", gpus=4, probe_report=probe)
    f = _flags(plan)
    assert (f["--speculative-num-steps"], f["--speculative-num-draft-tokens"]) == ("2", "3")
    assert json.loads(_flags(plan, "vllm")["--speculative-config"])["num_speculative_tokens"] == 1
    assert plan.speculative["sglang"]["from"] == "probe report"


def test_probe_saying_mtp_does_not_pay_drops_the_speculative_flags(qwen35) -> None:
    """No output recommends speculative flags next to a projection of no gain (issue 26 item 3)."""
    ck, mtp = qwen35
    probe = {"recommendation": {"enabled": False, "projected_speedup_bs1": 0.87,
                                "sglang": {"num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 2},
                                "vllm": {"num_speculative_tokens": 1}}}
    plan = make_plan(ck, mtp, gpu="b200", gpus=4, probe_report=probe)
    warnings = [n.message for n in plan.notes if n.severity == "warning" and "does not pay off" in n.message]
    assert len(warnings) == 2 and "x0.87" in warnings[0]
    assert not any(f.startswith("--speculative") for f in _flags(plan))
    assert "--speculative-config" not in _flags(plan, "vllm")
    assert not any(plan.speculative.values())
    assert plan.chosen.memory.mtp_bytes_per_rank == 0  # the draft is not loaded either
    drafting = make_plan(ck, mtp, gpu="b200", gpus=4)
    assert "--speculative-algorithm" in _flags(drafting)


def test_plan_says_what_decides_the_payoff_and_prints_the_probe_command() -> None:
    """A drafting plan without a probe report says what decides whether MTP pays, warns about random-token
    benchmarks and prints the probe command with this plan's GPU, layer-streamed (teacher mode under a
    memory cap) when the BF16 weights do not fit one GPU (DeepSeek-V3: ~1.3 TB BF16). The command needs the
    model's tokenizer, which deepseek-ai/DeepSeek-V3 ships (tokenizer.json); without one no command is
    printed (issue 34: no dead-end suggestion)."""
    from dataclasses import replace

    ck = deepseek_v3_fp8()
    bare = make_plan(ck, mtp_ready(), gpu="b200", gpus=8)
    assert not any("`ckptinspect probe " in n.message for n in bare.notes)
    plan = make_plan(replace(ck, files=(*ck.files, "tokenizer.json")), mtp_ready(), gpu="b200", gpus=8)
    [note] = [n.message for n in plan.notes if "ckptinspect probe" in n.message]
    assert "acceptance" in note and "concurrency" in note and "random" in note
    command = note.split("`")[1]
    assert command.split()[:2] == ["ckptinspect", "probe"]
    args = command.split()
    assert args[args.index("--gpu") + 1] == "b200"
    assert args[args.index("--mode") + 1] == "teacher" and "--max-gpu-memory" in args
    # a GPU other than the probe report's: the projection does not carry over
    probe = {"cost_model": {"gpu": "H200", "precision": "bf16", "speedup": []},
             "recommendation": {"enabled": True, "sglang": {"num_steps": 2}}}
    mismatch = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="b200", gpus=8, probe_report=probe)
    assert any(n.severity == "warning" and "--gpu b200" in n.message for n in mismatch.notes)
    same = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="h200", gpus=8, probe_report=probe)
    assert not any("rerun the probe" in n.message for n in same.notes)


def test_small_model_probe_command_is_not_streamed(qwen35) -> None:
    """Streamed mode only when the BF16 weights exceed one GPU: 397B params do not fit a B200, a 7B would."""
    from dataclasses import replace

    from ckptinspect.plan.gpus import find_gpu
    from ckptinspect.plan.payoff import probe_command
    from ckptinspect.records import Totals

    ck, _ = qwen35
    big = probe_command(ck, find_gpu("b200"))
    assert "--mode teacher" in big
    small = replace(ck, inventory=replace(ck.inventory, totals=Totals(tensors=1, params=7 * 10**9, bytes=14 * 10**9)))
    assert "--mode" not in probe_command(small, find_gpu("b200"))


def test_throughput_goal_prefers_ep_and_adds_caveat(qwen35) -> None:
    ck, mtp = qwen35
    plan = make_plan(ck, mtp, gpu="b200", gpus=4, goal="throughput")
    assert plan.chosen.memory.ep == 4
    assert plan.commands["sglang"].caveats and "concurrency" in plan.commands["sglang"].caveats[0]
    assert int(_flags(plan)["--max-running-requests"]) == engine_rules("sglang")["requests"]["throughput"]


def test_no_speculative_flags_without_usable_mtp() -> None:
    plan = make_plan(deepseek_v3_fp8(), mtp_ready(verdict="unusable"), gpu="h200", gpus=8)
    assert not any(f.startswith("--speculative") for f in _flags(plan))
    assert "--speculative-config" not in _flags(plan, "vllm")
    # Without the draft its MTP weights are not loaded.
    assert plan.chosen.memory.mtp_bytes_per_rank == 0


def test_smaller_context_raises_running_capacity() -> None:
    big = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="h200", gpus=8)
    small = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="h200", gpus=8, context=8192)
    assert small.chosen.kv.tokens == big.chosen.kv.tokens
    assert small.chosen.kv.tokens // 8192 > big.chosen.kv.tokens // big.context


def test_json_matches_schema_and_text_renders(qwen35) -> None:
    ck, mtp = qwen35
    plan = make_plan(ck, mtp, gpu="rtx-pro-6000", gpus=8)
    data = plan_json(plan)
    jsonschema.validate(data, SCHEMA)
    json.dumps(data)
    assert data["parallel"] == {"tp": 8, "ep": 1, "reason": plan.parallel_reason}
    for cmd in data["commands"].values():
        assert all(f["source"] and f["reason"] for f in cmd["flags"])
    md = render_plan_markdown(plan)
    assert "```sh" in md and "--moe-runner-backend" in md


def test_bad_inputs_raise_plan_error(qwen35) -> None:
    ck, mtp = qwen35
    with pytest.raises(PlanError, match="known GPUs"):
        make_plan(ck, mtp, gpu="v100", gpus=8)
    with pytest.raises(PlanError, match="goal"):
        make_plan(ck, mtp, gpu="b200", gpus=8, goal="cheap")
    with pytest.raises(PlanError, match="gpus"):
        make_plan(ck, mtp, gpu="b200", gpus=0)


def test_cli_plan_json_and_errors(qwen35, cli, tmp_path: Path) -> None:
    ck, _ = qwen35
    proc = cli("plan", ck.location, "--gpu", "b200", "--gpus", "8", "--format", "json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, SCHEMA)
    assert data["commands"]["sglang"]["argv"][:3] == ["python", "-m", "sglang.launch_server"]
    bad = cli("plan", ck.location, "--gpu", "v100", "--gpus", "8")
    assert bad.returncode == 2 and "known GPUs" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    tiny = cli("plan", ck.location, "--gpu", "rtx-5090", "--gpus", "2", "--quiet")
    assert tiny.returncode == 2 and "GiB more per GPU" in tiny.stderr
    tiny_json = cli("plan", ck.location, "--gpu", "rtx-5090", "--gpus", "2", "--quiet", "--format", "json")
    assert tiny_json.returncode == 2 and "GiB more per GPU" in tiny_json.stderr
    failed = json.loads(tiny_json.stdout)
    jsonschema.validate(failed, SCHEMA)
    assert failed["status"] == "failed" and "weights take" in failed["reason"]
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"recommendation": {"sglang": {"num_steps": 0}}}))
    badprobe = cli("plan", ck.location, "--gpu", "b200", "--gpus", "8", "--probe-report", str(probe), "--quiet")
    assert badprobe.returncode == 2 and "num_steps" in badprobe.stderr


def test_gpu_count_that_breaks_heads_names_the_check() -> None:
    # 96 heads / 6 = 16 is fine, but 8 KV heads neither divide nor are divisible by 6: the plan runs
    # on the 4 GPUs that can be used and names the check that keeps the other 2 idle.
    plan = make_plan(glm_4_5_fp8(), mtp_ready(), gpu="h200", gpus=6)
    assert plan.gpus == 6 and plan.gpus_used == 4 and plan.chosen.memory.tp == 4
    assert "num_key_value_heads 8" in plan.idle_reason and "2 of 6 GPUs stay idle" in plan.idle_reason
    assert _flags(plan)["--tp-size"] == "4"
    assert any(n.message == plan.idle_reason for n in plan.notes)


def test_rocm_nvfp4_uses_petit_and_warns(qwen35) -> None:
    ck, mtp = qwen35
    plan = make_plan(ck, mtp, gpu="mi355x", gpus=8)
    f = _flags(plan)
    assert f["--quantization"] == "petit_nvfp4" and f["--attention-backend"] == "aiter"
    assert "--fp4-gemm-backend" not in f
    assert any("Petit" in n.message for n in plan.notes)


def test_context_beyond_model_max_sets_what_each_engine_requires() -> None:
    """Issue 34: the command itself sets the variable the engine refuses to start without (main only warned)."""
    plan = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="b200", gpus=8, context=200_000)
    assert plan.commands["sglang"].shell().startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 ")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in plan.commands["vllm"].shell()
    assert any("exceeds the model's max_position_embeddings" in n.message for n in plan.notes)
    within = make_plan(deepseek_v3_fp8(), mtp_ready(), gpu="b200", gpus=8, context=100_000)
    assert not any("ALLOW" in e.name for c in within.commands.values() for e in c.env)


def test_pick_listed_as_known_bad_is_a_rule_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import copy

    from ckptinspect.errors import RuleError
    from ckptinspect.plan import backends

    broken = copy.deepcopy(engine_rules("sglang"))
    broken["settings"]["moe_runner_backend"]["picks"].insert(
        0, {"when": {"arch": ["sm120"]}, "value": "flashinfer_trtllm", "reason": "wrong", "source": "test"})
    monkeypatch.setattr(backends, "engine_rules", lambda name: broken if name == "sglang" else engine_rules(name))
    facts = backends.PlanFacts(arch="sm120", quant="nvfp4", attention="hybrid_linear", moe=True, interconnect="pcie",
                           spec=True, goal="latency", model_type="qwen3_5_moe")
    with pytest.raises(RuleError, match="known-bad"):
        backends.choose("sglang", facts)


def test_rule_file_failing_schema_names_the_file(tmp_path: Path) -> None:
    """An engine rule file that fails its schema, checked the way a user checks an edited copy
    (`rules validate`): one error naming the file and the missing key. The package's own files are
    validated in CI (tests/test_rule_documents.py), not on every load (ckptinspect/rules/documents.py)."""
    import yaml

    from ckptinspect.api import validate_rules
    from ckptinspect.plan import rules

    edited = tmp_path / "vllm.yaml"
    data = yaml.safe_load((rules.rules_root() / "engines" / "vllm.yaml").read_text())
    del data["settings"]["kv_cache_dtype"]["picks"][0]["source"]
    edited.write_text(yaml.safe_dump(data))
    [check] = validate_rules([edited])
    assert check.path == str(edited) and check.error is not None
    assert "vllm.yaml" in check.error and "source" in check.error
    unedited = tmp_path / "unedited.yaml"
    unedited.write_bytes((rules.rules_root() / "engines" / "vllm.yaml").read_bytes())
    assert [c.error for c in validate_rules([unedited])] == [None]  # the control: the shipped file passes


def test_tree_drafting_from_probe_moves_off_topk1_only_backend(qwen35) -> None:
    ck, mtp = qwen35
    probe = {"recommendation": {"sglang": {"num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}}}
    plan = make_plan(ck, mtp, gpu="b200", gpus=8, engine="sglang", probe_report=probe)
    f = _flags(plan)
    assert f["--speculative-eagle-topk"] == "4"
    assert f["--attention-backend"] in engine_rules("sglang")["speculative"]["topk_gt1_backends"]
    assert f["--attention-backend"] != "trtllm_mha"


def test_plan_without_readable_weights_is_a_failure_with_no_command(tmp_path: Path, cli) -> None:
    """A `.bin`-only checkpoint plans 0 GiB of weights on old main and prints commands (issue 26 item 4):
    now a failure naming the no-weights error, no command, exit 2; the report's plan section says so."""
    from ckptinspect import api
    from fixtures.spec import DATA_DIR

    (tmp_path / "config.json").write_bytes((DATA_DIR / "deepseek-ai__DeepSeek-V3__config.json").read_bytes())
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    from ckptinspect.errors import PlanNotPossible

    with pytest.raises(PlanNotPossible) as raised:
        api.plan(str(tmp_path), gpu="h200", gpus=8)
    result = raised.value.failure
    assert not result.ok and "no readable weights" in result.reason and "pytorch_model.bin" in result.reason
    r = cli("plan", str(tmp_path), "--gpu", "h200", "--gpus", "8")
    assert r.returncode == 2 and "no readable weights" in r.stderr
    assert "launch_server" not in r.stdout and "vllm serve" not in r.stdout
    report = api.inspect(str(tmp_path), gpu="h200", gpus=8)
    assert not report.plan.ok and any(f.code == "no-weights" and f.severity == "error"
                                      for f in report.checkpoint.findings)


@pytest.mark.parametrize("source, path, revision", [
    ({"kind": "hub", "ref": "deepseek-ai/DeepSeek-V3", "location": "https://hub/deepseek-ai/DeepSeek-V3",
      "revision": "a" * 40}, "deepseek-ai/DeepSeek-V3", "a" * 40),
    ({"kind": "hf-cache", "ref": "deepseek-ai/DeepSeek-V3@v1", "location": "/c/snapshots/x", "revision": "main"},
     "deepseek-ai/DeepSeek-V3", "v1"),
    ({"kind": "local", "ref": "./ds", "location": "/models/ds", "revision": None}, "/models/ds", None),
])
def test_plan_from_a_snapshot_serves_what_it_recorded(source, path, revision) -> None:
    """A snapshot holds headers, not weights: `--model-path x.json.gz` cannot be served (issue 26 item 4).
    The commands name the recorded repo id (and pin its commit) or the original directory."""
    from dataclasses import replace

    ck = replace(deepseek_v3_fp8(), kind="snapshot", ref="ds.json.gz", location="ds.json.gz",
                 stats={"snapshot_of": source})
    plan = make_plan(ck, mtp_ready(), gpu="h200", gpus=8)
    sg, vl = plan.commands["sglang"], plan.commands["vllm"]
    assert _flags(plan)["--model-path"] == path and vl.positional == (path,)
    assert _flags(plan).get("--revision") == revision and _flags(plan, "vllm").get("--revision") == revision
    assert "json.gz" not in sg.shell() + vl.shell()


def test_a_string_config_size_is_one_error_line_not_a_type_error(tmp_path: Path, make_fixture, cli) -> None:
    """benchmarks/fuzz.py (seed 2, case 50,747): a string linear_conv_kernel_dim crashed the plan's
    linear-attention state model with a TypeError traceback."""
    import shutil

    model = tmp_path / "m"
    shutil.copytree(make_fixture("qwen3_5_moe_nvfp4"), model)
    config = json.loads((model / "config.json").read_text())
    section = config.get("text_config", config)
    section["linear_conv_kernel_dim"] = "4"
    (model / "config.json").write_text(json.dumps(config))
    r = cli("report", str(model), "--gpu", "h200", "--gpus", "8")
    assert r.returncode == 2 and "linear_conv_kernel_dim must be a non-negative integer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
