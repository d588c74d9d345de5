"""Issue 33 follow-up: the MTP chain in slices of starts (chain.run_chain(start_slice=...)), CPU, fp32.
(1) differential: the sliced chain (every depth of a slice before the next, stream 1's keys of the
    earlier slices kept, the target's probabilities once per slice for all depths) gives the whole
    chain's drafts, target argmax and sum(min(p, q)), through the fused CPU kernel and the math
    fallback, for three MTP attention kinds;
(2) its memory estimate (scoring.sliced_scoring_bytes) bounds the bytes it really holds;
(3) layer-streamed: a document far longer than the slice the budget allows, at the floor the refusal
    names (lower than the whole-chain floor), gives exactly the unbounded run's numbers.
"""

from __future__ import annotations

import json

import pytest

from probe_helpers import LiveBytes, chain_inputs, fixture, load_main, torch

from ckptinspect.probe.runner import run_probe
from ckptinspect.render.probe_out import probe_json

TEXT = ("First check the chain, then the gears; the cat sat on the mat and looked at the door. "
        "Write a function that adds two numbers and returns the sum. Solve for x: 3x + 7 = 2x - 5. ")


def _counts(doc: dict) -> list:
    return [doc["overall"]["histogram"], doc["overall"]["sequences"]] + [
        (d["scored"], d["reached"], d["accepted"]) for d in doc["overall"]["depths"]]


def _head(kind):
    from ckptinspect.probe.runner import build_head

    main, spec = load_main(fixture(kind))
    return main, build_head(spec, main, fixture(kind))


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek", "mimo"])
def test_sliced_chain_equals_the_whole_chain(kind, monkeypatch):
    from ckptinspect.probe.chain import run_chain

    head, ids, hidden, target = chain_inputs(kind)
    whole = run_chain(head, ids, hidden, 3, target_logits_fn=target)
    assert whole.attention_kernels == ("cpu_flash",)

    def same(got):
        assert torch.equal(got.drafts, whole.drafts)
        assert torch.equal(got.target_argmax, whole.target_argmax)
        assert torch.equal(got.min_pq.isnan(), whole.min_pq.isnan())  # the starts past the document's end
        assert torch.allclose(got.min_pq, whole.min_pq, atol=1e-5, equal_nan=True)

    for width in (1, 7, 43):
        got = run_chain(head, ids, hidden, 3, target_logits_fn=target, start_slice=width)
        assert got.attention_kernels == ("cpu_flash",)
        same(got)
    # no target (greedy drafts only): the drafts alone
    assert torch.equal(run_chain(head, ids, hidden, 3, start_slice=5).drafts, whole.drafts)
    refuse = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("refused"))  # noqa: E731
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", refuse)
    for width, block in ((6, 4), (20, None)):
        got = run_chain(head, ids, hidden, 3, target_logits_fn=target, start_slice=width, attention_block=block)
        assert got.attention_kernels == ("math",)
        same(got)


@pytest.mark.parametrize("kind", ["qwen35moe", "deepseek"])
def test_sliced_chain_estimate_bounds_the_bytes_alive(kind):
    """sliced_scoring_bytes (no main forward: streamed) against every storage the sliced chain holds,
    target logits and probabilities included; and at one start per slice it is far below the whole
    chain's estimate for the same document (the document's per-start terms only)."""
    from ckptinspect.probe.chain import run_chain
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.evaluate import target_hidden
    from ckptinspect.probe.scoring import (ATTENTION_MIN_BLOCK, attention_dims, forward_bytes_per_token,
                                           scoring_bytes, sliced_scoring_bytes)

    main, head = _head(kind)
    cfg = open_checkpoint(fixture(kind)).checkpoint.config
    fwd = forward_bytes_per_token(cfg, torch.float32)
    lm_head = main.get_output_embeddings()
    for rows, n, width in ((2, 300, 16), (1, 200, 1), (1, 1500, 64)):
        ids = torch.randint(0, cfg.vocab_size, (rows, n), generator=torch.Generator().manual_seed(n))
        hidden = target_hidden(main, ids)
        with LiveBytes() as counted:
            h = hidden.clone()  # the batch's hidden states, as the streamed run stacks them
            run_chain(head, ids, h, 3, target_logits_fn=lambda a, b, h=h: lm_head(h[:, a:b]), start_slice=width)
            del h
        bound = sliced_scoring_bytes(rows, n, cfg.vocab_size, cfg.hidden_size, 3, torch.float32,
                                     cfg.num_attention_heads, None, 0, width, fwd, head_dims=attention_dims(cfg))
        assert counted.peak <= bound, (rows, n, width, counted.peak, bound)
        assert counted.peak >= bound // 8, (rows, n, width, counted.peak, bound)
    whole = min(scoring_bytes(1, 1500, cfg.vocab_size, cfg.hidden_size, 3, torch.float32, cfg.num_attention_heads,
                              block, 0, 16, fwd, head_dims=attention_dims(cfg)) for block in (None, ATTENTION_MIN_BLOCK))
    least = sliced_scoring_bytes(1, 1500, cfg.vocab_size, cfg.hidden_size, 3, torch.float32, cfg.num_attention_heads,
                                 ATTENTION_MIN_BLOCK, 0, 1, fwd, head_dims=attention_dims(cfg))
    assert least * 4 < whole, (least, whole)


def test_streamed_long_documents_in_pieces_at_the_new_floor(tmp_path):
    """Issue 33: documents 8x the model's positions and far longer than the piece / slice the budget
    allows, beside short ones, at the smallest budget the streamed run accepts: exactly the unbounded
    run's numbers. The refusal names every part of its floor, and the floor is below the one that held
    the longest document whole in the layer phase (one chunk) and its chain whole in the scoring phase."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.scoring import (ATTENTION_MIN_BLOCK, AUTO_FRACTION, attention_dims,
                                           forward_bytes_per_token, linear_attention_bytes_per_token, scoring_bytes)
    from ckptinspect.probe.stream import chunk_bytes
    from ckptinspect.probe.streamed_run import StreamFloorError

    kind = "qwen35moe"
    cfg = open_checkpoint(fixture(kind)).checkpoint.config
    positions = cfg.raw["max_position_embeddings"]
    docs = ([(TEXT * 60)[i * 11:][:8 * positions + 40 * i] for i in range(2)]
            + [TEXT[i:i + 90] for i in range(0, 60, 20)])
    corpus = tmp_path / "long.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": d, "category": "ab"[i % 2]}) for i, d in enumerate(docs)) + "\n")
    kw = dict(corpus=str(corpus), steps=3, mode="teacher", progress=False)
    with pytest.raises(StreamFloorError) as refused:
        run_probe(fixture(kind), max_gpu_memory=1e-4, **kw)
    floor, parts, text = refused.value.floor_bytes, refused.value.parts, str(refused.value)
    longest = max(len(d) for d in docs) + 2  # byte-level: a token a byte (+ 2 as a margin)
    for name in ("resident", "MTP layer", "one layer", "read ahead", "dequantization transient",
                 f"({longest - 2} tokens) through a layer in pieces of 64 tokens", "in slices of 1 start"):
        assert name in text, name
    fwd = forward_bytes_per_token(cfg, torch.float32)
    whole_chunk = chunk_bytes(longest, fwd, cfg.hidden_size, 4, linear_attention_bytes_per_token(cfg, 4))
    whole_chain = min(scoring_bytes(1, longest, cfg.vocab_size, cfg.hidden_size, 3, torch.float32,
                                    cfg.num_attention_heads, block, 0, 16, fwd, head_dims=attention_dims(cfg))
                      for block in (None, ATTENTION_MIN_BLOCK))  # the old floor's chain: whole, at its smallest
    bare = sum(parts[k] for k in ("resident", "mtp", "layer", "next_layer", "transient"))
    old_floor = max(bare + whole_chunk, (parts["resident"] + parts["mtp"] + whole_chain) / AUTO_FRACTION)
    assert parts["chunk"] < whole_chunk and floor < old_floor / 2, (floor, old_floor)
    assert floor >= bare + parts["chunk"]
    assert floor >= (parts["resident"] + parts["mtp"] + parts["scoring"]) / AUTO_FRACTION
    with pytest.raises(StreamFloorError):  # one byte less than the floor is refused
        run_probe(fixture(kind), max_gpu_memory=(floor - 1) / 2**30, **kw)
    bounded = probe_json(run_probe(fixture(kind), max_gpu_memory=(floor + 1) / 2**30, **kw))
    info = bounded["streaming"]
    assert bounded["main_model"]["source"] == "layer-streamed transformers"
    assert info["piece_tokens"] * 8 <= longest and info["chunk_tokens"] < longest  # the long ones in pieces
    assert bounded["attention"]["sliced_batches"] >= 1 and bounded["attention"]["start_slice"] * 8 <= longest
    assert info["estimate_bytes"]["total"] <= info["limit_bytes"]
    unbounded = probe_json(run_probe(fixture(kind), **kw))
    assert unbounded["main_model"]["source"] == "in-process transformers"
    assert unbounded["overall"]["depths"][0]["accepted"] > 0
    assert _counts(unbounded) == _counts(bounded)
    for da, db in zip(unbounded["overall"]["depths"], bounded["overall"]["depths"], strict=True):
        assert da["sampled_acceptance"] == pytest.approx(db["sampled_acceptance"], abs=1e-5)
    assert set(unbounded["categories"]) == set(bounded["categories"])


@pytest.mark.parametrize("kind", ["qwen35moe", "mimo"])
def test_layer_pieces_estimate_bounds_the_bytes_alive(kind):
    """The layer phase of one long sequence in pieces (StreamedMain._layer_in_pieces, its keys / states
    in transformers' cache) holds no more than the streamed estimate's layer-phase terms: the layer, the
    next one read ahead, a tensor's transient, the pieces' bytes (chunk_bytes of a piece +
    piece_sequence_bytes), and the sequence's residual stream in the store (in, out, final); and it
    gives the whole sequence's hidden states. Not DeepSeek: see test_probe_long's chunk-estimate test."""
    from ckptinspect.probe.checkpoint import open_checkpoint
    from ckptinspect.probe.evaluate import target_hidden
    from ckptinspect.probe.heads import find_spec
    from ckptinspect.probe.scoring import forward_bytes_per_token, linear_attention_bytes_per_token
    from ckptinspect.probe.stream import (StreamedMain, chunk_bytes, largest_layer_bytes, largest_stored_layer_bytes,
                                          piece_sequence_bytes, tensor_transient_bytes)
    from ckptinspect.probe.streamed_run import hf_config

    pc = open_checkpoint(fixture(kind))
    cfg = pc.checkpoint.config
    spec = find_spec(dict(cfg.raw))
    n, piece = 1500, 128
    ids = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(7))
    streamed = StreamedMain(fixture(kind), pc, hf_config(fixture(kind), dict(cfg.raw), spec, False),
                            dtype=torch.float32, device="cpu", chunk_tokens=piece, piece_tokens=piece)
    with torch.no_grad(), LiveBytes() as counted:
        finals = streamed.hidden_chunks([ids])
    fwd = forward_bytes_per_token(cfg, torch.float32)
    pieces = (chunk_bytes(piece, fwd, cfg.hidden_size, 4, linear_attention_bytes_per_token(cfg, 4))
              + piece_sequence_bytes(cfg, n, piece, 4))
    bound = (largest_layer_bytes(pc, torch.float32) + largest_stored_layer_bytes(pc) + tensor_transient_bytes(pc)
             + pieces + 3 * n * cfg.hidden_size * 4)
    assert counted.peak <= bound, (counted.peak, bound)
    assert counted.peak >= bound // 4, (counted.peak, bound)  # an estimate of this, not of something else
    main, _ = load_main(fixture(kind))
    whole = target_hidden(main, ids)
    assert torch.allclose(finals[0], whole, atol=1e-4), (finals[0] - whole).abs().max()
