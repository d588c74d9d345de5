"""The one per-GPU memory model: report --tp/--ep and plan agree; it matches a per-tensor reference walk
and SGLang's own memory-fraction arithmetic; the engines' EP rule refuses what they refuse."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors import safe_open

from ckptinspect.plan import Split, plan_or_failure, split_problem, weight_memory, weights_per_gpu
from ckptinspect.plan.kvcache import sglang_mem_fraction
from ckptinspect.plan.options import Option
from ckptinspect.plan.rules import PlanFacts, engine_rules
from ckptinspect.plan.mtp_cost import mtp_cost
from conftest import report_json

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1, "I8": 1, "I32": 4, "F64": 8, "I64": 8}


def _reference_bytes_per_rank(directory: Path, config: dict, tp: int, with_mtp: bool) -> tuple[int, int]:
    """Obviously-correct per-tensor walk (names and shapes from the `safetensors` library), SGLang split, EP = TP."""
    text = config.get("text_config", config)
    vocab, kv = text["vocab_size"], text["num_key_value_heads"]
    padded = -(-vocab // 64) * 64
    total, count = 0, 0
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(str(shard), "np") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                shape, nbytes = sl.get_shape(), math.prod(sl.get_shape()) * ITEMSIZE[sl.get_dtype()]
                is_mtp = name.startswith("mtp.")
                if is_mtp and not with_mtp:
                    continue
                count += 1
                if is_mtp and ("embed_tokens" in name or "lm_head" in name or "shared_head.head" in name):
                    continue
                if len(shape) <= 1 or "norm" in name.rsplit(".", 2)[-2] or ".mlp.gate." in name or ".visual." in name \
                        or name.startswith("model.visual."):
                    total += nbytes
                elif "embed_tokens" in name or name.startswith("lm_head"):
                    total += nbytes * padded / (vocab * tp)
                elif name.rsplit(".", 2)[-2] in ("k_proj", "v_proj") and "self_attn" in name:
                    heads = -(-kv // tp) if kv >= tp else 1
                    total += nbytes * heads / kv
                else:
                    total += nbytes / tp
    return int(total), count


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_memory_model_matches_a_per_tensor_reference(tp, bundled_example) -> None:
    ck, _ = bundled_example
    config = json.loads((Path(ck.location) / "config.json").read_text())
    for with_mtp in (False, True):
        ours = weight_memory(ck, Split.sglang(tp, tp), with_mtp=with_mtp).total_bytes_per_rank
        ref, tensors = _reference_bytes_per_rank(Path(ck.location), config, tp, with_mtp)
        # Ceil rounding happens per group in the model and per tensor here: at most one byte per tensor.
        assert abs(ours - ref) <= tensors, (tp, with_mtp, ours, ref)


@pytest.fixture(scope="module")
def bundled_example():
    from ckptinspect.examples import EXAMPLE_DIR
    from ckptinspect.pipeline import build_report

    r = build_report(str(EXAMPLE_DIR), progress=False)
    return r.checkpoint, r.mtp


def _options(result) -> list[Option]:
    return list(result.options)


@pytest.mark.parametrize("gpu", ["h200", "rtx-pro-6000"])
def test_report_cost_and_plan_agree_on_every_split(gpu, bundled_example, qwen35_report) -> None:
    for ck, mtp in (bundled_example, (qwen35_report.checkpoint, qwen35_report.mtp)):
        result = plan_or_failure(ck, mtp, gpu=gpu, gpus=8)  # the bundled example fails: options still carry memory
        assert result.options
        for o in _options(result):
            cost = mtp_cost(ck, mtp, o.memory.tp, o.memory.ep)
            assert cost.total_bytes_per_gpu == o.memory.total_bytes_per_rank
            assert cost.bytes_per_gpu == o.memory.mtp_bytes_per_rank
            assert weights_per_gpu(ck, o.memory.tp, o.memory.ep) == o.memory.total_bytes_per_rank


def test_cli_report_tp4_ep4_and_plan_print_the_same_gib(qwen35_replica, qwen35_report, cli) -> None:
    cost = report_json(qwen35_replica, "--tp", "4", "--ep", "4")["mtp"]["cost"][0]
    proc = cli("plan", str(qwen35_replica), "--gpu", "h200", "--gpus", "4", "--format", "json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    memory = json.loads(proc.stdout)["memory"]
    assert memory["tp"] == 4
    gib = 2**30
    assert round(cost["total_bytes_per_gpu"] / gib, 2) == pytest.approx(
        memory["weights_gib_per_gpu"] + memory["mtp_gib_per_gpu"], abs=0.011)
    # EP moves whole experts but keeps 1/TP of their bytes per rank (MoE-TP x EP = TP).
    ck, mtp = qwen35_report.checkpoint, qwen35_report.mtp
    assert mtp_cost(ck, mtp, 4, 4).total_bytes_per_gpu == mtp_cost(ck, mtp, 4, 1).total_bytes_per_gpu


def test_replicated_and_vocab_rules_act_on_the_full_scale_layout(qwen35_report) -> None:
    ck = qwen35_report.checkpoint
    m1 = weight_memory(ck, Split.sglang(1, 1), with_mtp=True)
    m8 = weight_memory(ck, Split.sglang(8, 8), with_mtp=True)
    # Norms / routers / vision are whole on every rank; the MTP embedding copy is never loaded.
    for rule in ("norms-routers-vision-replicated", "small-tensors-replicated"):
        assert m8.by_placement[rule] == m1.by_placement[rule] > 0
    assert m8.by_placement["routed-experts"] * 8 == pytest.approx(m1.by_placement["routed-experts"], rel=1e-6)
    kv_heads = ck.config.num_key_value_heads
    assert kv_heads < 8  # so KV projections are replicated to one head per rank at TP 8
    assert m8.by_placement["kv-projections"] == pytest.approx(m1.by_placement["kv-projections"] / kv_heads, rel=1e-6)


@pytest.mark.parametrize("tp,ep,ok", [(8, 8, True), (8, 4, True), (8, 2, True), (4, 1, True), (2, 8, False),
                                      (4, 3, False), (6, 4, False), (1, 2, False)])
def test_split_problem_is_the_engines_rule(tp, ep, ok) -> None:
    problem = split_problem(tp, ep)
    assert (problem == "") is ok
    if not ok:
        assert "SG:runtime_context.py" in problem and "VL:model_executor/layers/fused_moe/config.py" in problem


@pytest.mark.parametrize("args,needle", [(("--tp", "2", "--ep", "8"), "--ep 8 must divide --tp 2"),
                                         (("--tp", "4", "--ep", "3"), "--ep 3 must divide --tp 4"),
                                         (("--ep", "4"), "--ep needs --tp"),
                                         (("--gpu", "h200"), "--gpu and --gpus go together")])
def test_report_refuses_splits_the_engines_refuse(args, needle, cli) -> None:
    proc = cli("report", *args)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_memory_fraction_matches_sglangs_own_code_within_2_percent() -> None:
    """SGLang's handle_gpu_memory_settings (its source, run on CPU) vs our rules for the same GPU / TP."""
    from ckptinspect.plan.gpus import load_gpus
    from sglang_memory import sglang_memory_settings

    cases, ours = [], []
    for gpu in load_gpus():
        for tp in (1, 2, 4, 8):
            for attention in ("mla", "gqa"):
                facts = PlanFacts(arch=gpu.arch, quant="bf16", attention=attention, moe=True,
                              interconnect=gpu.interconnect, spec=False, goal="latency", model_type="x")
                mine = sglang_mem_fraction(gpu, tp, facts, capped=False)
                cases.append({"gpu_mib": gpu.memory_gib * 1024, "tp": tp, "mla": attention == "mla"})
                ours.append(mine)
                smaller = sglang_mem_fraction(gpu, tp, facts, chunked_prefill=2048, capped=False)
                cases.append({"gpu_mib": gpu.memory_gib * 1024, "tp": tp, "mla": attention == "mla", "chunked": 2048})
                ours.append(smaller)
    theirs = sglang_memory_settings(cases)
    assert len(theirs) == len(ours) > 40
    for case, mine, sg in zip(cases, ours, theirs):
        assert sg["chunked_prefill_size"] == mine.chunked_prefill_size, case
        assert sg["decode_max_bs"] == mine.cuda_graph_max_bs, case
        # The static pool (weights + KV) SGLang sizes from this fraction, within 2%.
        assert mine.formula == pytest.approx(sg["mem_fraction_static"], rel=0.02), case
    exact = sum(1 for mine, sg in zip(ours, theirs) if mine.formula == sg["mem_fraction_static"])
    assert exact == len(ours)  # the constants are copied from that code, so in fact they agree exactly


def test_placements_cover_every_group_of_every_layout(qwen35_report) -> None:
    from ckptinspect.plan.memory import placement_of
    from plan_checkpoints import deepseek_v3_fp8, glm_5_fp8, qwen3_next_80b

    ids = {p["id"] for p in engine_rules("common")["memory_model"]["placements"]}
    for ck in (qwen35_report.checkpoint, deepseek_v3_fp8(), glm_5_fp8(), qwen3_next_80b()):
        used = {placement_of(g)["id"] for g in ck.inventory.groups}
        assert used <= ids
    mla = {placement_of(g)["id"] for g in deepseek_v3_fp8().inventory.groups}
    assert {"mla-down-projections-replicated", "draft-shares-target-vocab", "vocab-parallel"} <= mla


def test_kv_bytes_per_token_match_sglangs_pool_arithmetic(qwen35_report) -> None:
    """SGLang's DefaultPoolConfigurator._compute_cell_size (its source, run on CPU) vs our KV models."""
    from ckptinspect.plan.kvcache import full_attention_layers, kv_cost
    from plan_checkpoints import deepseek_v3_fp8, glm_4_5_fp8, glm_5_fp8, qwen3_next_80b
    from sglang_memory import sglang_cell_sizes

    cases, ours = [], []
    for ck in (deepseek_v3_fp8(), glm_4_5_fp8(), glm_5_fp8(), qwen3_next_80b(), qwen35_report.checkpoint):
        cfg = ck.config
        hf = {"architectures": [cfg.architecture], "kv_lora_rank": cfg.kv_lora_rank,
              "qk_rope_head_dim": cfg.qk_rope_head_dim, "num_key_value_heads": cfg.num_key_value_heads,
              "head_dim": cfg.head_dim}
        for key in ("index_topk", "index_head_dim"):
            if cfg.text.get(key):
                hf[key] = cfg.text[key]
        for tp in (1, 8):
            for kv_dtype, sg_dtype in (("auto", "bf16"), ("fp8_e4m3", "fp8_e4m3")):
                # MTP draft layer included, as the plan counts it when speculative decoding is on.
                layers = full_attention_layers(ck) + 1
                cases.append({"hf": hf, "layers": layers, "tp": tp, "mla": cfg.attention_kind == "mla",
                              "kv_dtype": sg_dtype, "dsa_backend": "flashmla_sparse"})
                ours.append(kv_cost(ck, tp, kv_dtype, extra_layers=1).per_token)
    theirs = sglang_cell_sizes(cases)
    assert len(theirs) == len(ours) == 20
    for case, mine, sg in zip(cases, ours, theirs):
        assert mine == pytest.approx(sg, rel=0.02), case
    assert all(mine == sg for mine, sg in zip(ours, theirs))  # same arithmetic, so in fact exact
