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

from probe_helpers import LiveBytes, chain_inputs, fixture, load_main, torch, write_prompts

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


def reference_chain(head, ids, hidden, steps, target):
    """The chain as first written (the definition the fast path must equal): every depth runs the MTP
    layer over all its streams through transformers' own attention with the dense stream mask and the
    MLP over every row, then keeps the last stream; softmaxes of the whole [B, S, vocab] at once."""
    from ckptinspect.probe.chain import stream_mask

    bsz, n = ids.shape
    seq = n - 1
    base = torch.arange(1, seq + 1)[None].expand(bsz, seq)
    embs, hids, drafts, min_pq = [head.embed(ids[:, 1:])], [hidden[:, :-1]], [], []
    for depth in range(1, steps + 1):
        pos = torch.cat([base + i for i in range(depth)], dim=1)
        mask = stream_mask(depth, seq, hidden.dtype, "cpu").expand(bsz, -1, -1, -1)
        out = head.step(torch.cat(embs, 1), torch.cat(hids, 1), pos, mask)[:, -seq:]
        logits = head.logits(out)
        d = logits.argmax(-1)
        pq = torch.full((bsz, seq), float("nan"))
        valid = seq - depth + 1  # starts t with t + depth <= n - 1
        p = torch.softmax(logits[:, :valid].float(), -1)
        q = torch.softmax(target(depth, depth + valid).float(), -1)
        pq[:, :valid] = torch.minimum(p, q).sum(-1)
        drafts.append(d)
        min_pq.append(pq)
        embs.append(head.embed(d))
        hids.append(out)
    return torch.stack(drafts), torch.stack(min_pq)


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek", "mimo"])
def test_chain_equals_the_full_stream_dense_mask_reference(kind, monkeypatch):
    """The chain computes only the kept stream (its queries through a fused causal kernel merged with the
    same-start keys by log-sum-exp, its rows through the MLP): drafts and sum(min(p, q)) equal the full
    dense-mask computation for three MTP attention kinds (Qwen3.5 gated GQA + MoE, DeepSeek MLA with
    unequal head sizes + MoE, MiMo/Qwen2), through the fused CPU kernel and through the float32 math
    fallback in uneven blocks."""
    from ckptinspect.probe import stream_attention
    from ckptinspect.probe.chain import run_chain

    head, ids, hidden, target = chain_inputs(kind)
    with torch.no_grad():
        ref_drafts, ref_pq = reference_chain(head, ids, hidden, 3, target)
    fast = run_chain(head, ids, hidden, 3, target_logits_fn=target)
    assert fast.attention_kernels == ("cpu_flash",)
    assert torch.equal(fast.drafts, ref_drafts)
    assert torch.allclose(fast.min_pq, ref_pq, atol=1e-5, equal_nan=True)
    # the math fallback (a kernel that refuses the shape), in uneven blocks and tiny logits chunks
    refuse = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("refused"))  # noqa: E731
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", refuse)
    for block, logits_tokens in ((7, 2048), (44, 10), (1000, 1)):
        blocked = run_chain(head, ids, hidden, 3, target_logits_fn=target, attention_block=block,
                            logits_tokens=logits_tokens)
        assert blocked.attention_kernels == ("math",)
        assert torch.equal(blocked.drafts, ref_drafts), block
        assert torch.allclose(blocked.min_pq, ref_pq, atol=1e-5, equal_nan=True), block
    # outside the chain the head's attention is transformers' own again
    cfgs = {id(m.config): m.config._attn_implementation for m in head.modules() if hasattr(m, "config")}
    assert "ckptinspect_draft_streams" not in cfgs.values()


@pytest.mark.parametrize("piece", [None, 100])
def test_merged_causal_attention_equals_the_dense_softmax_at_large_scores(piece, monkeypatch):
    """The log-sum-exp merge of the causal part and the same-start keys stays exact where scores are
    large (no exponential overflows) and for grouped heads with unequal value size; also with the merge
    taken a few starts at a time (``PIECE_ELEMENTS``)."""
    from ckptinspect.probe import stream_attention
    from ckptinspect.probe.chain import stream_mask

    if piece:
        monkeypatch.setattr(stream_attention, "PIECE_ELEMENTS", piece)
    from ckptinspect.probe.stream_attention import streams_attention, streams_layout

    g = torch.Generator().manual_seed(0)
    depth, seq, heads, kv_heads = 3, 9, 4, 2
    q = torch.randn(2, heads, depth * seq, 16, generator=g) * 12
    k = torch.randn(2, kv_heads, depth * seq, 16, generator=g) * 12
    v = torch.randn(2, kv_heads, depth * seq, 8, generator=g)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    dense = torch.softmax(q @ kr.transpose(-1, -2) * 0.25 + stream_mask(depth, seq, torch.float32, "cpu"), -1) @ vr
    with streams_layout(torch.nn.Module(), depth, seq, 4):
        out, _ = streams_attention(None, q, k, v, None, scaling=0.25)
    assert torch.allclose(out.transpose(1, 2)[:, :, -seq:], dense[:, :, -seq:], atol=1e-5)
    assert not out[:, :-seq].any()  # the earlier streams' rows are never computed


def _budget(kind, length, steps):
    """(limit, dense_max): the memory limit (bytes) that the blocked chain needs for a ``length``-token
    document at its smallest block and logits chunk, and the longest document whose dense chain fits
    it, both by the probe's own estimate."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.runner import AUTO_BATCH_FRACTION
    from ckptinspect.probe.scoring import (ATTENTION_MIN_BLOCK, SLACK_BYTES, attention_dims, forward_bytes_per_token,
                                           scoring_bytes,
                                           weight_bytes)

    pc = open_checkpoint(fixture(kind))
    cfg = pc.checkpoint.config
    fwd = forward_bytes_per_token(cfg, torch.float32)

    def scratch(n, block, logits):
        return scoring_bytes(1, n, cfg.vocab_size, cfg.hidden_size, steps, torch.float32, cfg.num_attention_heads,
                             block, fwd, logits, head_dims=attention_dims(cfg))
    fixed = weight_bytes(pc.metas, torch.float32) + SLACK_BYTES
    limit = int((fixed + scratch(length, ATTENTION_MIN_BLOCK, 16)) / AUTO_BATCH_FRACTION) + 2
    longest = 1
    while fixed + scratch(longest + 1, None, 16) <= int(limit * AUTO_BATCH_FRACTION):
        longest += 1
    return limit, longest


def test_document_longer_than_the_dense_path_allows(tmp_path, monkeypatch):
    """The budget is what the blocked path needs for the whole document (smallest blocks and logits
    chunks); the dense path (all starts' scores at once where no fused kernel runs) fits at most half
    the document in it (an eighth before the chain computed only its kept stream: ~4,800
    tokens, the fixture's hidden width of 64 making the per-token terms large beside 4 heads)."""
    kind = "qwen35moe"
    doc = tmp_path / "long.txt"
    doc.write_text((TEXT * 40)[:4800])  # byte-level tokenizer: one document of ~4,800 tokens
    unbounded = probe_json(run_probe(fixture(kind), corpus=str(doc), steps=3, mode="teacher", progress=False))
    tokens = unbounded["tokens_scored"]
    assert unbounded["attention"] == {"dense_batches": 1, "blocked_batches": 0, "causal_kernels": ["cpu_flash"]}
    limit, dense_max = _budget(kind, tokens, 3)
    assert tokens >= 2 * dense_max, (tokens, dense_max)
    bounded = probe_json(run_probe(fixture(kind), corpus=str(doc), steps=3, mode="teacher", progress=False,
                                   memory_limit=limit))
    assert bounded["main_model"]["source"] == "in-process transformers"
    assert bounded["attention"] == {"dense_batches": 0, "blocked_batches": 1, "causal_kernels": ["cpu_flash"]}
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
    from ckptinspect.probe.scoring import (SLACK_BYTES, attention_dims, forward_bytes_per_token, scoring_bytes,
                                           weight_bytes)

    pc = open_checkpoint(fixture(kind))
    cfg = pc.checkpoint.config
    tokens = unbounded["tokens_scored"]
    longest = max(60 + (i * 37) % 180 for i in range(40)) + 2
    # the scoring activations of the whole corpus at once (the unbounded run's one batch), by the estimate
    everything = scoring_bytes(40, longest, cfg.vocab_size, cfg.hidden_size, 3, torch.float32,
                               cfg.num_attention_heads, None, forward_bytes_per_token(cfg, torch.float32),
                               head_dims=attention_dims(cfg))
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
    from ckptinspect.probe.scoring import attention_dims, forward_bytes_per_token, scoring_bytes
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
                               cfg.num_attention_heads, None, forward_bytes_per_token(cfg, torch.float32),
                               head_dims=attention_dims(cfg))
    assert everything >= 10 * floor, (everything, floor)
    with pytest.raises(StreamFloorError):  # one byte less than the floor is refused
        run_probe(fixture(kind), max_gpu_memory=(floor - 1) / 2**30, **kw)
    bounded = probe_json(run_probe(fixture(kind), max_gpu_memory=(floor + 1) / 2**30, **kw))
    info = bounded["streaming"]
    assert bounded["main_model"]["source"] == "layer-streamed transformers"
    assert min(len(d) for d in docs) >= 8 * positions
    # at the floor the longest documents run through the layers in pieces (the chunk no longer holds them)
    assert info["piece_tokens"] < longest - 2 and info["estimate_bytes"]["total"] <= info["limit_bytes"]
    assert bounded["attention"]["blocked_batches"] >= 1  # the scoring scratch at its smallest: blocked attention
    _same(unbounded, bounded)


@pytest.mark.parametrize("dims,groups,kernel_ok", [((64, 64), 4, True), ((48, 32), 1, True), ((64, 64), 4, False)])
def test_chain_attention_estimate_bounds_the_bytes_alive(dims, groups, kernel_ok, monkeypatch):
    """scoring.chain_attention_bytes against the bytes the streams' attention really holds at its peak
    (every storage it creates, counted while alive): GQA (4 query heads per key head), MLA-like unequal
    head sizes, and the math fallback; and the merge taken in small pieces stays under it too."""
    from ckptinspect.probe import stream_attention
    from ckptinspect.probe.scoring import chain_attention_bytes
    from ckptinspect.probe.stream_attention import streams_attention, streams_layout

    if not kernel_ok:
        refuse = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("refused"))  # noqa: E731
        monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", refuse)
    monkeypatch.setattr(stream_attention, "PIECE_ELEMENTS", 1 << 16)
    batch, seq, heads, steps = 2, 300, 8, 3
    qk, v = dims
    g = torch.Generator().manual_seed(1)
    query = torch.randn(batch, heads, steps * seq, qk, generator=g, dtype=torch.bfloat16)
    key = torch.randn(batch, heads // groups, steps * seq, qk, generator=g, dtype=torch.bfloat16)
    value = torch.randn(batch, heads // groups, steps * seq, v, generator=g, dtype=torch.bfloat16)
    for block in (None, 64):
        with streams_layout(torch.nn.Module(), steps, seq, block or seq), LiveBytes() as counted:
            out, _ = streams_attention(None, query, key, value, None)
            del out
        bound = chain_attention_bytes(batch, seq, steps, heads, qk, v, 2, block)
        assert counted.peak <= bound, (counted.peak, bound)
        assert counted.peak >= bound // 4, (counted.peak, bound)  # an estimate of this, not of something else


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek", "mimo"])
def test_chain_estimate_bounds_the_bytes_alive(kind):
    """The whole chain (MTP layer over the streams, attention, MLP on the kept stream) holds at its
    peak no more than scoring.scoring_bytes says for it (no logits: vocab 0; streamed: no main forward)."""
    from ckptinspect.probe.chain import run_chain
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.evaluate import target_hidden
    from ckptinspect.probe.runner import build_head
    from ckptinspect.probe.scoring import attention_dims, forward_bytes_per_token, scoring_bytes

    main, spec = load_main(fixture(kind))
    head = build_head(spec, main, fixture(kind))
    cfg = open_checkpoint(fixture(kind)).checkpoint.config
    fwd = forward_bytes_per_token(cfg, torch.float32)
    for rows, n in ((4, 200), (1, 1500)):
        ids = torch.randint(0, cfg.vocab_size, (rows, n), generator=torch.Generator().manual_seed(n))
        hidden = target_hidden(main, ids)
        with LiveBytes() as counted:
            run_chain(head, ids, hidden, 3)
        bound = scoring_bytes(rows, n, 0, cfg.hidden_size, 3, torch.float32, cfg.num_attention_heads, None, 0, 2048,
                              fwd, head_dims=attention_dims(cfg))
        assert counted.peak <= bound, (rows, n, counted.peak, bound)


@pytest.mark.parametrize("heads", [(4, 2, 16, 16), (8, 2, 32, 32), (16, 4, 32, 32), (32, 8, 16, 16)])
def test_linear_attention_estimate_bounds_the_bytes_alive(heads):
    """A Gated DeltaNet layer (Qwen3.5's linear attention; the torch recurrence, no flash-linear-attention
    here) holds per token no more than scoring.linear_attention_bytes_per_token, and not far less
    (value heads, key heads, key / value head sizes varied around the fixture's)."""
    import copy

    from ckptinspect.probe.scoring import linear_attention_bytes_per_token

    main, _ = load_main(fixture("qwen35moe"))
    template = main.get_decoder().layers[0].linear_attn
    cfg = copy.deepcopy(main.config.get_text_config())
    v_heads, k_heads, k_dim, v_dim = heads
    cfg.linear_num_value_heads, cfg.linear_num_key_heads = v_heads, k_heads
    cfg.linear_key_head_dim, cfg.linear_value_head_dim = k_dim, v_dim
    layer = type(template)(cfg, 0).eval()

    class Normalized:
        text = {"linear_num_value_heads": v_heads, "linear_num_key_heads": k_heads, "linear_key_head_dim": k_dim,
                "linear_value_head_dim": v_dim}

    per_token = linear_attention_bytes_per_token(Normalized, per=4, fused=False)
    n = 2048
    x = torch.randn(1, n, cfg.hidden_size)
    with torch.no_grad(), LiveBytes() as counted:
        layer(x)
    assert counted.peak <= per_token * n, (counted.peak / n, per_token)
    assert counted.peak >= per_token * n // 2, (counted.peak / n, per_token)


@pytest.mark.parametrize("kind", ["qwen35moe", "mimo"])
def test_layer_phase_chunk_estimate_bounds_the_forward(kind):
    """One chunk's forward through the main model (what the streamed layer phase runs per layer) holds
    no more than stream.chunk_bytes with the linear-attention term (qwen35moe has a linear layer).
    Not DeepSeek here: on a CPU, SDPA takes MLA's unequal head sizes to its math path, which
    materializes seq^2 scores that a GPU's memory-efficient kernel never holds."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.evaluate import target_hidden
    from ckptinspect.probe.scoring import forward_bytes_per_token, linear_attention_bytes_per_token
    from ckptinspect.probe.stream import chunk_bytes

    main, _ = load_main(fixture(kind))
    cfg = open_checkpoint(fixture(kind)).checkpoint.config
    fwd = forward_bytes_per_token(cfg, torch.float32)
    linear = linear_attention_bytes_per_token(cfg, 4)
    for rows, n in ((1, 1024), (4, 256)):
        ids = torch.randint(0, cfg.vocab_size, (rows, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad(), LiveBytes() as counted:
            target_hidden(main, ids)
        bound = chunk_bytes(rows * n, fwd, cfg.hidden_size, 4, linear)
        assert counted.peak <= bound, (kind, rows, n, counted.peak, bound)
