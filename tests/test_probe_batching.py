"""The built-in prompt set, its category subsets, the default (memory-sized) greedy batch, and
transformers' MoE experts implementations, which must give the eager numbers (CPU, fp32)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from probe_helpers import fixture, load_main, torch, write_prompts

from ckptinspect.errors import ProbeError
from ckptinspect.probe.evaluate import target_hidden
from ckptinspect.probe.prompts import builtin_prompts
from ckptinspect.probe.runner import AUTO_BATCH_FRACTION, auto_batch, run_probe, select_categories
from ckptinspect.render.probe_out import probe_json

CATEGORIES = {"chat", "code", "math", "reasoning", "summarisation", "multilingual"}


def test_builtin_prompt_set_is_large_distinct_and_covers_every_category():
    prompts = builtin_prompts()
    texts = [p.text for p in prompts]
    assert len(texts) >= 128 and len(set(texts)) == len(texts)
    counts = {c: sum(p.category == c for p in prompts) for c in CATEGORIES}
    assert set(p.category for p in prompts) == CATEGORIES and min(counts.values()) >= 16, counts
    code_math = select_categories(prompts, ["code", "math"], "builtin")
    assert {p.category for p in code_math} == {"code", "math"}
    assert len(code_math) == counts["code"] + counts["math"]
    assert select_categories(prompts, None, "builtin") == prompts
    with pytest.raises(ProbeError, match="no prompts of category poetry"):
        select_categories(prompts, ["code", "poetry"], "builtin")


@settings(max_examples=200, deadline=None)
@given(per=st.integers(1, 1000), base=st.integers(0, 10_000), count=st.integers(1, 300), limit=st.integers(1, 400_000))
def test_auto_batch_is_the_largest_batch_that_fits(per, base, count, limit):
    def need(b):  # any increasing estimate
        return base + per * b

    got, why = auto_batch(need, count, limit)
    fits = [b for b in range(1, count + 1) if need(b) <= int(limit * AUTO_BATCH_FRACTION)]
    assert got == (max(fits) if fits else 1) and "auto" in why


def test_greedy_default_batch_takes_every_prompt_that_fits(tmp_path, monkeypatch):
    prompts = write_prompts(tmp_path, [f"Say something about the number {i}." for i in range(6)])
    ample = probe_json(run_probe(fixture("deepseek"), prompts=prompts, steps=1, max_new_tokens=8, progress=False))
    assert ample["batch_size"] == 6 and ample["batch_size_source"].startswith("auto")
    given = probe_json(run_probe(fixture("deepseek"), prompts=prompts, steps=1, max_new_tokens=8, progress=False,
                                 batch_size=2))
    assert given["batch_size"] == 2 and given["batch_size_source"] == "given"
    # one byte less than batch 6 needs: the default batch shrinks to one that fits, same samples scored
    limit = int((ample["memory_estimate_bytes"] - 1) / AUTO_BATCH_FRACTION)
    small = probe_json(run_probe(fixture("deepseek"), prompts=prompts, steps=1, max_new_tokens=8, progress=False,
                                 memory_limit=limit))
    assert 1 <= small["batch_size"] < 6, small["batch_size_source"]
    assert small["memory_estimate_bytes"] <= limit * AUTO_BATCH_FRACTION
    assert small["overall"]["depths"][0]["scored"] == ample["overall"]["depths"][0]["scored"]


@pytest.mark.parametrize("kind", ["deepseek", "qwen35moe"])
def test_experts_implementations_give_the_eager_numbers(tmp_path, kind):
    """grouped_mm / batched_mm (transformers integrations/moe.py) against the eager per-expert loop:
    target hidden states within 1e-5 relative (fp32, CPU), and the probe's counts identical."""
    main, _ = load_main(fixture(kind))
    ids = torch.randint(0, main.config.get_text_config().vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    hidden = {}
    for impl in ("eager", "grouped_mm", "batched_mm"):
        main.set_experts_implementation(impl)
        assert main.get_experts_implementation()[""] == impl
        hidden[impl] = target_hidden(main, ids).double()
    for impl in ("grouped_mm", "batched_mm"):
        rel = (hidden[impl] - hidden["eager"]).norm() / hidden["eager"].norm()
        assert rel < 1e-5, (impl, float(rel))
    prompts = write_prompts(tmp_path, ["Write a Python function that adds two numbers.",
                                       "Solve for x: 3x + 7 = 2x - 5.", "What are three ways to water a garden?"])
    runs = {impl: probe_json(run_probe(fixture(kind), prompts=prompts, steps=2, max_new_tokens=24, progress=False,
                                       experts_implementation=impl))
            for impl in ("eager", "grouped_mm", "batched_mm")}
    for impl, doc in runs.items():
        assert doc["experts_implementation"] == {"requested": impl, "forward": impl, "decode": impl}
        assert doc["overall"]["histogram"] == runs["eager"]["overall"]["histogram"], impl
        assert [(d["reached"], d["accepted"], d["scored"]) for d in doc["overall"]["depths"]] == \
            [(d["reached"], d["accepted"], d["scored"]) for d in runs["eager"]["overall"]["depths"]], impl


def test_experts_implementation_on_a_dense_model_is_refused_or_reported_absent(tmp_path):
    prompts = write_prompts(tmp_path, ["Solve for x: 3x + 7 = 2x - 5."])
    doc = probe_json(run_probe(fixture("mimo"), prompts=prompts, steps=1, max_new_tokens=8, progress=False))
    assert doc["experts_implementation"] == {"requested": "auto", "forward": None, "decode": None}
    with pytest.raises(ProbeError, match="no swappable MoE experts"):
        run_probe(fixture("mimo"), prompts=prompts, steps=1, max_new_tokens=8, progress=False,
                  experts_implementation="grouped_mm")
    with pytest.raises(ProbeError, match="server runs the main model"):
        run_probe(fixture("mimo"), prompts=prompts, steps=1, max_new_tokens=8, progress=False,
                  experts_implementation="eager", main_url="http://127.0.0.1:9")
    with pytest.raises(ProbeError, match="unknown experts implementation"):
        run_probe(fixture("mimo"), prompts=prompts, steps=1, max_new_tokens=8, progress=False,
                  experts_implementation="fast")


@pytest.mark.parametrize("kind", ["deepseek", "qwen35moe"])
def test_params_per_expert_from_the_inventory_match_the_config(kind):
    """The batched_mm decode term uses one expert's params from the report's inventory; a routed
    expert is gate + up + down of hidden x moe_intermediate_size."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.runner import _params_per_expert

    pc = open_checkpoint(fixture(kind))
    text = pc.checkpoint.config.text
    assert _params_per_expert(pc) == 3 * text["hidden_size"] * text["moe_intermediate_size"]
    assert _params_per_expert(open_checkpoint(fixture("mimo"))) == 0  # dense


def test_scoring_estimate_takes_the_larger_phase():
    from ckptinspect.probe.scoring import LOGITS_TOKENS, decode_bytes, scoring_bytes

    bf16 = torch.bfloat16
    streams = 4 * 144 * 625 * 2048 * 4 * 2
    # logits in chunks: LOGITS_TOKENS // 144 = 14 positions of every row at a time
    logits = 144 * (LOGITS_TOKENS // 144) * 32768 * (2 * 2 + 12)
    # 16 heads of 2048 / 16 = 128: the kept stream's attention at depth 3 (stream_attention.py): at bf16 the
    # expanded keys / values, query copy, padded values (4 x 128) and the causal output + 3 streams' output
    # rows (4 x 128); float32 the log-sum-exp and output (1 + 128), the merge's pieces (8 + 2 x 2 of them,
    # capped at PIECE_ELEMENTS), and the math path's scores: all 625 starts x 625 keys (block None) or 64
    from ckptinspect.probe.stream_attention import PIECE_ELEMENTS

    rows16 = 144 * 16 * 625

    def attention(rows, block, d=128):
        return (rows * (4 * d + 4 * d) * 2 + rows * (1 + d) * 4 + min(rows * d, PIECE_ELEMENTS) * 4 * 12
                + rows * block * 8)

    attention16 = attention(rows16, 625)
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=16) == max(logits, attention16) + streams
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=0) == logits + streams
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=32) == max(logits, attention(2 * rows16, 625, 64)) + streams  # 32 heads of 64
    # MLA: query/key and value head sizes differ (192 / 128)
    mla = (rows16 * (4 * 192 + 4 * 128) * 2 + rows16 * 129 * 4 + min(rows16 * 192, PIECE_ELEMENTS) * 4 * 12
           + rows16 * 625 * 8)
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=16, head_dims=(192, 128)) == max(logits, mla) + streams
    # the chain's own activations (K x seq positions) join its attention; the main forward is its own phase.
    # Per position the layer's hidden-size terms (8 x hidden x 2 B); its MLP runs 8,192 positions at a time
    fwd = 100_000
    hidden_terms = 8 * 2048 * 2
    chain = 144 * 3 * 625 * hidden_terms + 8192 * (fwd - hidden_terms)
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=16, forward_per_token=fwd) == attention16 + chain + streams
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=0, forward_per_token=fwd, chain_per_token=0) == \
        max(logits, 144 * 625 * fwd) + streams
    # blocked: the math path's scores for 64 starts at a time, no seq^2 (nor (K*S)^2) term
    blocked = attention(rows16, 64)
    assert scoring_bytes(144, 625, 32768, 2048, 3, bf16, heads=16, block=64) == max(logits, blocked) + streams
    assert decode_bytes(144, 6, 3 * 4096 * 1024, bf16) == 144 * 6 * 3 * 4096 * 1024 * 2


def test_plan_batches_bounds_every_batch_by_the_budget():
    """Any corpus: every planned batch's scratch fits the budget, rows and tokens caps hold, the
    batches partition the sequences, and dense attention is used wherever it fits."""
    import random

    from ckptinspect.probe.scoring import plan_batches

    rng = random.Random(5)
    for _ in range(30):
        lengths = [rng.randint(2, 3000) for _ in range(rng.randint(1, 60))]
        budget = rng.randint(2_000_000, 400_000_000)
        max_rows, max_tokens = rng.randint(1, 64), rng.choice([None, 4096])

        def scratch(rows, width, block, logits=2048):
            dense = rows * 4 * (3 * width) ** 2 * 8 if block is None else rows * 4 * block * width * 8
            return dense + rows * width * 2000 + min(rows * width, logits) * 100

        try:
            batches = plan_batches(lengths, max_rows, budget, scratch, heads=4, max_tokens=max_tokens)
        except ProbeError as exc:
            assert "needs about" in str(exc)
            assert any(scratch(1, n, 16, 16) > budget for n in lengths)
            continue
        seen = sorted(i for b in batches for i in b.indices)
        assert seen == list(range(len(lengths)))
        for b in batches:
            assert b.width == max(lengths[i] for i in b.indices) and len(b.indices) <= max_rows
            assert scratch(len(b.indices), b.width, b.attention_block, b.logits_tokens) <= budget
            if max_tokens and len(b.indices) > 1:
                assert len(b.indices) * b.width <= max_tokens
            if b.attention_block is not None:
                assert scratch(len(b.indices), b.width, None, 16) > budget


def test_plan_batches_slices_only_a_sequence_alone():
    """The chain in slices of starts is the fallback of one sequence whose whole chain does not fit, never
    a way to put more rows in a batch: where two long sequences' whole chains do not fit together, they
    are two batches with whole chains (the H100 run where they were batched in slices of 4 starts spent
    146 s in the MTP layer against 5.8 s; BENCHMARKS.md, fourth and fifth device runs)."""
    from ckptinspect.probe.scoring import plan_batches

    def scratch(rows, width, block, logits=2048):  # whole chain: per row and position
        return rows * width * 1000

    def sliced(rows, width, block, starts):  # slices: per row, small
        return rows * (width * 10 + starts * 1000)

    budget = 1000 * 1000  # one 1000-token sequence whole, not two; a 1500-token one only in slices
    batches = plan_batches([1000, 1000, 1500], 30, budget, scratch, heads=1, sliced_at=sliced)
    assert [(len(b.indices), b.start_slice) for b in batches] == [(1, None), (1, None), (1, batches[2].start_slice)]
    assert batches[2].start_slice is not None and sliced(1, 1500, batches[2].attention_block, batches[2].start_slice) <= budget


def test_probe_text_and_json_come_from_one_layout(tmp_path):
    """render/probe_out.py owns both formats: the JSON text is probe_json's document, and every depth
    row, the batch and the experts line of the text show the JSON's values; the module is torch-free."""
    import subprocess
    import sys

    from ckptinspect.render.probe_out import render_probe

    prompts = write_prompts(tmp_path, ["Solve for x: 3x + 7 = 2x - 5.", "Write a haiku about rain."])
    result = run_probe(fixture("qwen35moe"), prompts=prompts, steps=2, max_new_tokens=16, progress=False)
    doc = probe_json(result)
    assert json.loads(render_probe(result, "json")) == json.loads(json.dumps(doc))
    text = render_probe(result, "text", width=None)
    for row in doc["overall"]["depths"]:
        cond = "-" if row["conditional"] is None else f"{row['conditional']:.3f}"
        assert any(line.split()[:2] == [str(row["k"]), cond] for line in text.splitlines()), (row, text)
    assert f"batch size {doc['batch_size']} (auto" in text
    experts = doc["experts_implementation"]
    assert f"forward {experts['forward']}, decode {experts['decode']}" in text
    assert result.alpha1 == doc["overall"]["depths"][0]["conditional"]
    code = "import sys, ckptinspect.render.probe_out; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ}).returncode == 0


def test_cli_category_and_experts_errors_are_one_line_exit_2():
    import subprocess
    import sys

    from probe_helpers import ROOT

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ckptinspect", "probe", *args, "--device", "cpu", "-q"],
                              capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": ROOT})

    proc = cli(fixture("deepseek"), "--categories", "code,poetry")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no prompts of category poetry" in proc.stderr and "reasoning" in proc.stderr
    proc = cli(fixture("mimo"), "--experts-implementation", "grouped_mm", "--max-prompts", "1")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no swappable MoE experts" in proc.stderr


def test_experts_implementation_choices_agree_everywhere():
    """The CLI's choices (no torch import there), the loader's list and the JSON schema's enum."""
    from ckptinspect.cli.probe_cmd import probe as probe_command
    from ckptinspect.probe.loader import EXPERTS_IMPLEMENTATIONS

    option = next(p for p in probe_command.params if p.name == "experts_implementation")
    schema = json.load(open(os.path.join(os.path.dirname(__file__), "..", "ckptinspect", "probe", "probe.schema.json")))
    enum = schema["properties"]["experts_implementation"]["properties"]["requested"]["enum"]
    assert tuple(option.type.choices) == EXPERTS_IMPLEMENTATIONS == tuple(enum)


def test_probe_records_do_not_render_themselves():
    """issue 13 item 5: the probe's records are plain data; render/probe_out.py builds the layout."""
    from ckptinspect.probe import cost, metrics, result, stream

    for module in (result, metrics, stream, cost):
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                assert not hasattr(cls, "to_json"), f"{module.__name__}.{cls.__name__} renders itself"
        assert not any(name.startswith("render") for name in vars(module)), module.__name__
