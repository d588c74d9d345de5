"""Probe on real-sized inputs (issue 22), CPU, fp32:
(1) the blocked draft-stream attention gives the dense mask's drafts and sum(min(p, q)) (three MTP
    attention kinds: Qwen3.5 gated GQA, DeepSeek MLA, MiMo/Qwen2);
(2) a document 8x longer than the dense-mask path allows under a memory budget gives exactly the
    numbers of the unbounded (dense) run;
(3) a corpus whose activations exceed the budget 10x (in-memory batches, and layer-streamed with a host
    store taken in rounds) gives exactly the unbounded run's numbers;
(4) the synthetic category: benchmark-style id runs, reported beside the real categories.
"""

from __future__ import annotations

import json

import pytest

from probe_helpers import fixture, load_main, torch, write_prompts

from ckptinspect.probe.runner import run_probe
from ckptinspect.render.probe_out import probe_json, render_probe

TEXT = ("First check the chain, then the gears; the cat sat on the mat and looked at the door. "
        "Write a function that adds two numbers and returns the sum. Solve for x: 3x + 7 = 2x - 5. ")


def _counts(doc: dict) -> list:
    return [doc["overall"]["histogram"], doc["overall"]["sequences"]] + [
        (d["scored"], d["reached"], d["accepted"]) for d in doc["overall"]["depths"]]


def _same(a: dict, b: dict) -> None:
    assert _counts(a) == _counts(b)
    for da, db in zip(a["overall"]["depths"], b["overall"]["depths"], strict=True):
        assert da["sampled_acceptance"] == pytest.approx(db["sampled_acceptance"], abs=1e-5)
    assert set(a["categories"]) == set(b["categories"])


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek", "mimo"])
def test_blocked_stream_attention_equals_the_dense_mask(kind):
    from ckptinspect.probe.chain import run_chain
    from ckptinspect.probe.evaluate import target_hidden
    from ckptinspect.probe.runner import build_head

    main, spec = load_main(fixture(kind))
    head = build_head(spec, main, fixture(kind))
    vocab = main.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (2, 45), generator=torch.Generator().manual_seed(3))
    hidden = target_hidden(main, ids)
    lm_head = main.get_output_embeddings()

    def target(start, end):
        return lm_head(hidden[:, start:end])

    dense = run_chain(head, ids, hidden, 3, target_logits_fn=target)
    for block, logits_tokens in ((7, 2048), (44, 10), (1000, 1)):  # uneven blocks; tiny logits chunks
        blocked = run_chain(head, ids, hidden, 3, target_logits_fn=target, attention_block=block,
                            logits_tokens=logits_tokens)
        assert torch.equal(blocked.drafts, dense.drafts), block
        assert torch.allclose(blocked.min_pq, dense.min_pq, atol=1e-5, equal_nan=True), block
    # outside the chain the head's attention is transformers' own again
    cfgs = {id(m.config): m.config._attn_implementation for m in head.modules() if hasattr(m, "config")}
    assert "ckptinspect_draft_streams" not in cfgs.values()


def _budget(kind, length, steps):
    """(limit, dense_max): the memory limit (bytes) that the blocked chain needs for a ``length``-token
    document at its smallest block and logits chunk, and the longest document whose dense chain fits
    it, both by the probe's own estimate."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.runner import AUTO_BATCH_FRACTION
    from ckptinspect.probe.scoring import (ATTENTION_MIN_BLOCK, SLACK_BYTES, forward_bytes_per_token, scoring_bytes,
                                           weight_bytes)

    pc = open_checkpoint(fixture(kind))
    cfg = pc.checkpoint.config
    fwd = forward_bytes_per_token(cfg, torch.float32)

    def scratch(n, block, logits):
        return scoring_bytes(1, n, cfg.vocab_size, cfg.hidden_size, steps, torch.float32, cfg.num_attention_heads,
                             block, fwd, logits)
    fixed = weight_bytes(pc.metas, torch.float32) + SLACK_BYTES
    limit = int((fixed + scratch(length, ATTENTION_MIN_BLOCK, 16)) / AUTO_BATCH_FRACTION) + 2
    longest = 1
    while fixed + scratch(longest + 1, None, 16) <= int(limit * AUTO_BATCH_FRACTION):
        longest += 1
    return limit, longest


def test_document_8x_longer_than_the_dense_path_allows(tmp_path, monkeypatch):
    """The budget is what the blocked path needs for the whole document (smallest blocks and logits
    chunks); the dense path fits at most an eighth of the document in it. The fixture's hidden width
    (64) makes the per-token terms large beside the 4-head attention, so 8x takes ~4,800 tokens."""
    kind = "qwen35moe"
    doc = tmp_path / "long.txt"
    doc.write_text((TEXT * 40)[:4800])  # byte-level tokenizer: one document of ~4,800 tokens
    unbounded = probe_json(run_probe(fixture(kind), corpus=str(doc), steps=3, mode="teacher", progress=False))
    tokens = unbounded["tokens_scored"]
    assert unbounded["attention"] == {"dense_batches": 1, "blocked_batches": 0}
    limit, dense_max = _budget(kind, tokens, 3)
    assert tokens >= 8 * dense_max, (tokens, dense_max)
    bounded = probe_json(run_probe(fixture(kind), corpus=str(doc), steps=3, mode="teacher", progress=False,
                                   memory_limit=limit))
    assert bounded["main_model"]["source"] == "in-process transformers"
    assert bounded["attention"] == {"dense_batches": 0, "blocked_batches": 1}
    assert bounded["memory_estimate_bytes"] <= limit
    assert unbounded["overall"]["depths"][0]["reached"] > 4000 and unbounded["overall"]["depths"][0]["accepted"] > 0
    _same(unbounded, bounded)


def test_corpus_10x_over_the_budget_in_memory_and_streamed(tmp_path, monkeypatch):
    kind = "qwen35moe"
    docs = [(TEXT * 3)[i * 7 % 97:][:60 + (i * 37) % 180] for i in range(40)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": d, "category": "ab"[i % 2]}) for i, d in enumerate(docs)) + "\n")
    kw = dict(corpus=str(corpus), steps=3, mode="teacher", progress=False)
    unbounded = probe_json(run_probe(fixture(kind), **kw))
    assert unbounded["batch_size"] == 40  # ample memory: one batch

    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.runner import AUTO_BATCH_FRACTION
    from ckptinspect.probe.scoring import SLACK_BYTES, forward_bytes_per_token, scoring_bytes, weight_bytes

    pc = open_checkpoint(fixture(kind))
    cfg = pc.checkpoint.config
    tokens = unbounded["tokens_scored"]
    longest = max(60 + (i * 37) % 180 for i in range(40)) + 2
    # the scoring activations of the whole corpus at once (the unbounded run's one batch), by the estimate
    everything = scoring_bytes(40, longest, cfg.vocab_size, cfg.hidden_size, 3, torch.float32,
                               cfg.num_attention_heads, None, forward_bytes_per_token(cfg, torch.float32))
    limit = int((weight_bytes(pc.metas, torch.float32) + SLACK_BYTES + everything // 10) / AUTO_BATCH_FRACTION)
    in_memory = probe_json(run_probe(fixture(kind), memory_limit=limit, **kw))
    assert in_memory["main_model"]["source"] == "in-process transformers"
    assert in_memory["memory_estimate_bytes"] <= limit and in_memory["batch_size"] < 40
    _same(unbounded, in_memory)

    hidden_bytes = tokens * cfg.hidden_size * 4
    streamed = probe_json(run_probe(fixture(kind), max_gpu_memory=0.1, stream_chunk_tokens=256, stream_store="host",
                                    host_memory_limit=hidden_bytes // 10, **kw))
    info = streamed["streaming"]
    assert streamed["main_model"]["source"] == "layer-streamed transformers"
    assert info["store"] == "host" and info["rounds"] >= 10, info
    assert info["layers"] == info["rounds"] * cfg.num_hidden_layers  # every round reads every layer
    _same(unbounded, streamed)


def test_streamed_device_and_host_stores_agree(tmp_path):
    prompts = write_prompts(tmp_path, [TEXT[:90], TEXT[40:200], TEXT[100:]])
    kw = dict(prompts=prompts, steps=2, mode="teacher", progress=False, max_gpu_memory=0.1, stream_chunk_tokens=64)
    device = probe_json(run_probe(fixture("deepseek"), **kw))
    host = probe_json(run_probe(fixture("deepseek"), stream_store="host", **kw))
    assert device["streaming"]["store"] == "device" and host["streaming"]["store"] == "host"
    assert device["streaming"]["estimate_bytes"]["store"] > 0 == host["streaming"]["estimate_bytes"]["store"]
    _same(device, host)


def test_synthetic_category_beside_the_real_ones(tmp_path):
    from ckptinspect.probe.synthetic import synthetic_prompts

    result = run_probe(fixture("mimo"), categories=["code", "synthetic"], synthetic_len=48, max_new_tokens=12, steps=2,
                       progress=False)
    doc = probe_json(result)
    assert set(doc["categories"]) == {"code", "synthetic"}
    assert doc["categories"]["synthetic"]["sequences"] == 24
    # scored from the prompt end: starts P-1 .. P+12-K-2 of each 12-token continuation (K = 2)
    assert doc["categories"]["synthetic"]["depths"][0]["reached"] == 24 * (12 - 2)
    assert "synthetic: " in render_probe(result, "text") and "code: " in render_probe(result, "text")
    # vLLM RandomDataset's layout: runs of consecutive ids of the non-special vocabulary, a random offset each
    prompts = synthetic_prompts(100, [0, 1, 2], count=5, length=30)
    allowed = list(range(3, 100))
    for p in prompts:
        start = allowed.index(p.ids[0])
        assert list(p.ids) == [allowed[(start + j) % len(allowed)] for j in range(30)]
    assert len({p.ids[0] for p in prompts}) > 1
    teacher = probe_json(run_probe(fixture("mimo"), categories=["synthetic"], synthetic_len=48, steps=2,
                                   mode="teacher", progress=False))
    assert set(teacher["categories"]) == {"synthetic"} and teacher["tokens_scored"] == 24 * 48


def test_streamed_at_the_floor_budget_gives_the_unbounded_numbers(tmp_path):
    """Issue 33: documents 8x longer than the model's positions, a corpus whose one-batch scoring
    activations are over 10x the budget, and the smallest budget the streamed run accepts (the floor
    its refusal names): exactly the unbounded run's numbers, the chunk sized to the budget."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.scoring import forward_bytes_per_token, scoring_bytes
    from ckptinspect.probe.streamed_run import StreamFloorError

    kind = "qwen35moe"
    cfg = open_checkpoint(fixture(kind)).checkpoint.config
    positions = cfg.raw["max_position_embeddings"]
    docs = [(TEXT * 60)[i * 11:][:8 * positions + 40 * i] for i in range(2)]  # byte-level: one token a byte
    corpus = tmp_path / "long.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": d, "category": "ab"[i]}) for i, d in enumerate(docs)) + "\n")
    kw = dict(corpus=str(corpus), steps=3, mode="teacher", progress=False)
    unbounded = probe_json(run_probe(fixture(kind), **kw))
    assert unbounded["main_model"]["source"] == "in-process transformers"
    with pytest.raises(StreamFloorError) as refused:
        run_probe(fixture(kind), max_gpu_memory=1e-4, **kw)
    floor = refused.value.floor_bytes
    assert "needs at least" in str(refused.value) and "the corpus size does not matter" in str(refused.value)
    longest = max(len(d) for d in docs) + 2  # + the tokenizer's own tokens
    everything = scoring_bytes(len(docs), longest, cfg.vocab_size, cfg.hidden_size, 3, torch.float32,
                               cfg.num_attention_heads, None, forward_bytes_per_token(cfg, torch.float32))
    assert everything >= 10 * floor, (everything, floor)
    with pytest.raises(StreamFloorError):  # one byte less than the floor is refused
        run_probe(fixture(kind), max_gpu_memory=(floor - 1) / 2**30, **kw)
    bounded = probe_json(run_probe(fixture(kind), max_gpu_memory=(floor + 1) / 2**30, **kw))
    info = bounded["streaming"]
    assert bounded["main_model"]["source"] == "layer-streamed transformers"
    assert min(len(d) for d in docs) >= 8 * positions
    assert info["chunk_tokens"] >= longest - 2 and info["estimate_bytes"]["total"] <= info["limit_bytes"]
    assert bounded["attention"]["blocked_batches"] >= 1  # the scoring scratch at its smallest: blocked attention
    _same(unbounded, bounded)
