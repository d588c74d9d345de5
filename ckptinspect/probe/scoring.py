"""Device memory of a run and the batched scoring loop (target forward -> MTP chain -> walk)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader
from ckptinspect.probe.chain import MLP_PIECE_TOKENS
from ckptinspect.probe.evaluate import Sequence, score_batch
from ckptinspect.probe.metrics import Tally


# The chain's slices of starts where a whole document's chain does not fit (plan_batches, chain.run_chain):
# a slice of 1 start is the floor; larger slices cost fewer MTP-layer calls.
SLICE_STARTS = tuple(4096 >> i for i in range(13))  # 4096 .. 1
# None: the streamed run slices a document's chain only where its whole chain does not fit. Preferring
# slices of 1,024 starts (the target's softmax once per position, not once per depth) has no measurement
# in its favour: the one H100 run that preferred them also batched long documents in tiny slices (BENCHMARKS.md,
# "Fourth to sixth device runs"), and the whole chain then ran 62 s end to end; ``prefer_sliced_from`` keeps it testable.
PREFERRED_SLICE: int | None = None
AUTO_FRACTION = 0.9  # of the free (or allowed) memory a default plan fills; in-memory peaks ran 0.98-1.02x the estimate (BENCHMARKS.md 6, run 6)
LOGITS_TOKENS = 2048  # batch rows x positions whose logits exist at once (chain.py, evaluate.py)
ATTENTION_MIN_BLOCK = 16  # starts per block of the long-document attention (stream_attention.py)
# Larger blocks buy little (a block of 1k+ starts already fills the GPU) and a block's scores are one
# allocation: a 26 GiB one failed in a fragmented cache (BENCHMARKS.md section 11), so they are capped.
ATTENTION_BLOCK_BYTES = 2 << 30


def forward_bytes_per_token(cfg, dtype: torch.dtype) -> int:
    """Transient device bytes per token of one decoder layer's forward (the main model's, in memory or
    streamed): the residual stream and its norms, the attention projections (~8 x hidden), the MLP or
    the routed experts' gathered inputs and intermediates (top_k x (2 x hidden + 3 x expert width)),
    and the experts' float32 combine."""
    per = torch.tensor([], dtype=dtype).element_size()
    hidden = cfg.hidden_size
    top_k = cfg.experts_per_token or 0
    moe = top_k * (2 * hidden + 3 * (cfg.moe_intermediate_size or 0)) if cfg.routed_experts else 0
    dense = 3 * (cfg.intermediate_size or 0)
    # transformers' routed experts combine their outputs with float32 routing weights: the per-token,
    # per-expert outputs exist in float32 too (two buffers). Without this term a streamed chunk on an
    # H200 peaked 1.13-1.22x the estimate and a 300k-token batch failed in one 37 GiB allocation
    # (BENCHMARKS.md section 11).
    fp32_combine = top_k * hidden * 8 if cfg.routed_experts else 0
    return per * (8 * hidden + max(moe, dense)) + fp32_combine + linear_attention_bytes_per_token(cfg, per)


def linear_attention_bytes_per_token(cfg, per: int = 2, fused: bool | None = None) -> int:
    """Per token of a linear-attention (Gated DeltaNet, Qwen3.5 / Qwen3-Next) layer's forward, which
    exists for every token of the forward at once (a recurrence over the sequence: no MLP pieces):
    - at the compute dtype (``per`` bytes): the input projection (query, key, value, gate) and its
      convolved copy, the gated norm's input, output and gate, the query / key repeated to the value
      heads;
    - the recurrence. ``fused`` (default: whether flash-linear-attention imports, which transformers
      then runs): its chunked kernel keeps one float32 k x v state per head per 64-token chunk, its
      w / u / output at the compute dtype and two 64 x 64 float32 matrices per head per token-chunk.
      Without it transformers' torch recurrence (``torch_chunk_gated_delta_rule``) keeps about a dozen
      value-heads-wide float32 tensors (q, k, v, their beta- and decay-weighted copies, the solved
      values, the output) and three 64 x 64 float32 matrices per head together (measured on CPU
      within 2% of this count: tests/test_probe_long.py).
    Without this term the streamed Qwen3.5-397B layout (3 of 4 layers linear) peaked 6.4 GB over its
    estimate at a 40 GiB budget (issue 33). 0 for a model without linear-attention layers."""
    text = cfg.text if isinstance(getattr(cfg, "text", None), dict) else {}
    v_heads = text.get("linear_num_value_heads") or 0
    if not v_heads:
        return 0
    k_heads = text.get("linear_num_key_heads") or v_heads
    k_dim = text.get("linear_key_head_dim") or 0
    v_dim = text.get("linear_value_head_dim") or 0
    width = v_heads * max(k_dim, v_dim)
    chunk = 64  # the recurrence's chunk of tokens (transformers' and flash-linear-attention's chunk_size)
    projections = per * (2 * (2 * k_heads * k_dim + 2 * v_heads * v_dim) + 3 * width + 2 * v_heads * k_dim)
    if fused is None:
        fused = fused_linear_attention()
    if fused:
        recurrence = v_heads * k_dim * v_dim * 4 // chunk + 3 * width * per + 2 * v_heads * chunk * 4
    else:
        recurrence = 4 * (12 * width + 3 * v_heads * chunk)
    return projections + recurrence


def fused_linear_attention() -> bool:
    """Whether transformers runs linear attention through flash-linear-attention (the package imports)."""
    import importlib.util

    return importlib.util.find_spec("fla") is not None


def scoring_bytes(batch: int, seq: int, vocab: int, hidden: int, steps: int, dtype: torch.dtype,
                  heads: int = 0, block: int | None = None, forward_per_token: int = 0,
                  logits_tokens: int = LOGITS_TOKENS, chain_per_token: int | None = None,
                  head_dims: tuple[int, int] | None = None) -> int:
    """Peak scratch of scoring one batch of ``batch`` rows x ``seq`` tokens, the largest of its phases
    plus the K side-by-side hidden streams held throughout:
    - forward: the main model's forward over the batch (``forward_per_token`` each; 0 when the hidden
      states come from elsewhere, as when streaming);
    - the chain at depth K: the MTP layer's own activations over the K x seq stream positions
      (``chain_per_token`` each, default ``forward_per_token``: it is one decoder layer of the main
      model's kind; measured on an H200, BENCHMARKS.md section 11: without it a streamed run of 80
      rows peaked at 2.2x the estimate) plus its attention;
    - logits: draft and target logits at the compute dtype plus the float32 softmaxes of
      sum(min(p, q)) (p, q, one temporary), for ``logits_tokens`` rows x positions at a time (at least
      one position of every row);
    - attention at depth K (``chain_attention_bytes``; ``head_dims`` (query/key, value) head sizes,
      default hidden / heads)."""
    per = torch.tensor([], dtype=dtype).element_size()
    rows_x_positions = batch * min(seq, max(1, logits_tokens // max(batch, 1)))
    logits = rows_x_positions * vocab * (2 * per + 12)
    qk, v = head_dims or ((hidden // heads, hidden // heads) if heads else (0, 0))
    attention = chain_attention_bytes(batch, seq, steps, heads, qk, v, per, block)
    forward = batch * seq * forward_per_token
    # the chain's MLP runs chain.MLP_PIECE_TOKENS stream positions at a time: per position only the
    # hidden-size terms of the layer stay (8 x hidden), the MLP's own for one piece
    per_position = forward_per_token if chain_per_token is None else chain_per_token
    positions = batch * steps * seq
    hidden_terms = min(per_position, 8 * hidden * per)
    # The attention module's per-position tensors scale with heads x head size, not the hidden size:
    # Qwen3.5's gated attention (32 x 256 = 2 x hidden) holds its q_proj output (query and gate), the
    # rotated query, the attention output, the gate's sigmoid and the gated product at once (~5 widths)
    # beside ~3 hidden-size ones (residual, norm, input projection): more than the 8 x hidden above.
    width = heads * max(qk, v)
    attention_terms = max(0, (3 * hidden + 5 * width) * per - hidden_terms) if per_position else 0
    # the MLP / MoE runs only on the kept stream (batch x seq rows), chain.MLP_PIECE_TOKENS at a time
    chain = (positions * (hidden_terms + attention_terms)
             + min(batch * seq, MLP_PIECE_TOKENS) * (per_position - hidden_terms))
    return max(logits, attention + chain, forward) + 4 * batch * seq * hidden * (steps + 1) * per


def sliced_scoring_bytes(batch: int, seq: int, vocab: int, hidden: int, steps: int, dtype: torch.dtype,
                         heads: int = 0, block: int | None = None, forward_per_token: int = 0,
                         start_slice: int = 1, chain_per_token: int | None = None,
                         head_dims: tuple[int, int] | None = None) -> int:
    """Peak scratch of scoring one batch with the chain taken ``start_slice`` starts at a time
    (``chain.run_chain(start_slice=...)``): the slice's chain (``scoring_bytes``' chain and stream
    terms for ``start_slice`` starts) or its logits, beside what exists for the whole document:
    - per start of the document: the batch's target hidden states and their finiteness check (one
      byte each), the token ids, the drafts, sum(min(p, q)) and the target's argmax;
    - stream 1's keys and values of every start (``stream_attention.StartPrefix``, counted at the
      query heads, at least its key heads) and one call's GQA-expanded copy of them, plus the math
      path's float32 copy;
    - the slice's attention over those keys: the math path's float32 scores of ``block`` (None: the
      slice's) queries x every key, and the float32 merge of the causal part with the earlier slices'
      part (a handful of [batch, heads, slice, head size] tensors);
    - the slice's logits: draft logits and float32 probabilities of its starts, the target's logits and
      float32 probabilities of its starts + K positions (2 x dtype + 12 bytes per row and vocab entry,
      as ``scoring_bytes`` counts them);
    - or the main model's forward over the whole batch (``forward_per_token`` each, 0 when the hidden
      states come from elsewhere, as when streaming), before the chain."""
    per = torch.tensor([], dtype=dtype).element_size()
    w = max(1, min(seq, start_slice))
    qk, v = head_dims or ((hidden // heads, hidden // heads) if heads else (0, 0))
    per_position = forward_per_token if chain_per_token is None else chain_per_token
    # the slice's chain and its K + 1 hidden streams (no logits: vocab 0; scores counted below)
    chain = scoring_bytes(batch, w, 0, hidden, steps, dtype, heads, 1, 0, 1, chain_per_token=per_position,
                          head_dims=(qk, v))
    scores = batch * heads * min(block or w, w) * seq * 8
    merge = 6 * batch * heads * w * (max(qk, v) + 1) * 4
    prefix = batch * heads * seq * (qk + v) * (2 * per + 4)
    logits = batch * (w + steps) * vocab * (2 * per + 12) + 4 * batch * w * hidden * (steps + 1) * per
    document = batch * seq * (hidden * (per + 1) + 12 * steps + 16)
    # + the fused kernels' own per-call buffers (CPU flash: per thread a query block x key block of
    # float32 scores), which do not shrink with the slice: measured ~100 KB over the terms above at one
    # start per slice on the test fixtures (tests/test_probe_sliced.py)
    return document + prefix + max(logits, chain + scores + merge + FUSED_SCRATCH, batch * seq * forward_per_token)


FUSED_SCRATCH = 1 << 20


def attention_dims(cfg) -> tuple[int, int]:
    """(query/key, value) head sizes of the model's (and its MTP layer's) attention: MLA's
    nope + rope and v_head_dim, else head_dim (hidden / heads when the config names none)."""
    heads = cfg.num_attention_heads or 1
    if cfg.kv_lora_rank:
        return (cfg.qk_nope_head_dim or 0) + (cfg.qk_rope_head_dim or 0), cfg.v_head_dim or 0
    d = cfg.head_dim or cfg.hidden_size // heads
    return d, d


def chain_attention_bytes(batch: int, seq: int, steps: int, heads: int, qk_dim: int, v_dim: int, per: int,
                          block: int | None) -> int:
    """Device bytes of the chain's attention step at depth ``steps`` (stream_attention.streams_attention),
    which computes only the kept stream's ``seq`` queries per row, beside transformers' own projections
    (counted with the layer's per-position terms):
    - at the compute dtype: the GQA-expanded stream-1 keys and values, a contiguous copy of the kept
      queries, MLA's zero-padded values (3 x qk + qk), the causal part's output, and the output rows
      of all ``steps`` streams (v each);
    - float32: the causal part's log-sum-exp and output (the math path's), and the same-start merge's
      temporaries, at most stream_attention.PIECE_ELEMENTS at a time: the scaled queries, a float32
      key, their product, the merged output, a float32 value and its weighted copy, plus one expanded
      key / value per deeper stream (8 + 2 x (steps - 1) pieces, float32 counted for all);
    - the float32 scores of the math path when no fused kernel takes the shape: ``block`` starts
      (None: all ``seq``) x seq keys, counted twice (the scores and the product's transients).
    The widths are the real head sizes x heads: Qwen3.5's 32 x 256 is twice its hidden size, and a
    streamed run at a 40 GiB budget peaked 6.4 GB over an estimate that used the hidden size here."""
    from ckptinspect.probe.stream_attention import PIECE_ELEMENTS

    rows = batch * heads * seq
    width = max(qk_dim, v_dim)
    dtype_terms = rows * (4 * qk_dim + (steps + 1) * v_dim) * per
    float_terms = rows * (1 + v_dim) * 4 + min(rows * width, PIECE_ELEMENTS) * 4 * (8 + 2 * (steps - 1))
    scores = batch * heads * (block or seq) * seq * 8
    return dtype_terms + float_terms + scores


def decode_bytes(batch: int, top_k: int, expert_params: int, dtype: torch.dtype) -> int:
    """transformers' ``batched_mm`` experts (what ``generate`` decodes with on a GPU) gather a copy
    of each selected expert's weights per token: batch x top_k x one expert's params, transient."""
    return batch * top_k * expert_params * torch.tensor([], dtype=dtype).element_size()


def kv_bytes_per_token(cfg, dtype: torch.dtype) -> int:
    """transformers' KV cache per token over all decoder layers (generation): keys and values at the
    compute dtype. MLA (DeepSeek) caches the decompressed per-head keys (nope + rope dims) and values;
    otherwise key/value heads x head_dim each. Linear-attention layers keep a fixed-size state, counted
    like attention layers here (an over-estimate, never an under-estimate)."""
    per = torch.tensor([], dtype=dtype).element_size()
    heads = cfg.num_attention_heads or 1
    if cfg.kv_lora_rank:
        width = heads * ((cfg.qk_nope_head_dim or 0) + (cfg.qk_rope_head_dim or 0) + (cfg.v_head_dim or 0))
    else:
        kv_heads = cfg.num_key_value_heads or heads
        width = 2 * kv_heads * (cfg.head_dim or cfg.hidden_size // heads)
    return width * per * cfg.num_hidden_layers


def generation_bytes(batch: int, prompt: int, total: int, cfg, dtype: torch.dtype, forward_per_token: int,
                     vocab: int, decode: int) -> int:
    """Peak transient of greedy generation for ``batch`` prompts of at most ``prompt`` tokens growing to
    ``total``: the KV cache of the whole length, plus the larger of the prefill's layer activations
    and float32 last-position logits, and the decode step's ``decode`` (``decode_bytes``)."""
    per = torch.tensor([], dtype=dtype).element_size()
    return batch * total * kv_bytes_per_token(cfg, dtype) + max(batch * prompt * forward_per_token + batch * vocab * (per + 4),
                                                                decode)


def estimate_bytes(metas, dtype: torch.dtype, *, batch: int = 0, seq: int = 0, vocab: int = 0, hidden: int = 0,
                   steps: int = 1, heads: int = 0, decode: int = 0, block: int | None = None,
                   forward_per_token: int = 0) -> int:
    """Device bytes of an in-memory run: the weights after dequantization at ``dtype``, the larger
    of the scoring scratch of the largest batch and the ``decode`` transient of generation, and
    SLACK_BYTES of allocator slack."""
    return (weight_bytes(metas, dtype)
            + max(scoring_bytes(batch, seq, vocab, hidden, steps, dtype, heads, block, forward_per_token), decode)
            + SLACK_BYTES)


SLACK_BYTES = 256 << 20


def weight_bytes(metas, dtype: torch.dtype) -> int:
    return loader.logical_params(metas) * torch.tensor([], dtype=dtype).element_size()


@dataclass(frozen=True)
class Batch:
    """Sequences scored together: their indices, padded width, and how the chain attends."""

    indices: tuple[int, ...]
    width: int
    attention_block: int | None  # None: the dense stream mask; else starts per block (stream_attention.py)
    logits_tokens: int = 2048  # rows x positions whose logits exist at once
    start_slice: int | None = None  # the chain in slices of this many starts (chain.run_chain), None: whole


def plan_batches(lengths: list[int], max_rows: int, budget: int,
                 scratch_at: Callable[[int, int, int | None, int], int], *, heads: int = 1,
                 source: str = "", max_tokens: int | None = None,
                 sliced_at: Callable[[int, int, int | None, int], int] | None = None,
                 prefer_sliced_from: int | None = None) -> list[Batch]:
    """Batches over sequences sorted by length (least padding): each takes the next sequences while it
    has at most ``max_rows`` and its scratch ``scratch_at(rows, width, block, logits_tokens)`` fits
    ``budget`` bytes: the dense stream mask where that fits, else the blocked attention (the largest
    block that fits, its scores at most ATTENTION_BLOCK_BYTES over ``heads`` heads), and the logits in chunks of LOGITS_TOKENS, halved while they do not fit. Device
    memory is bounded by the budget whatever the corpus size; a single sequence that does not fit even
    with the smallest blocks and chunks is an error naming its length. ``max_tokens``: a batch of
    several sequences holds at most this many padded tokens (a longer sequence is a batch alone).
    ``sliced_at(rows, width, block, start_slice)``: where even the smallest blocks and chunks do not
    fit, the chain is taken in slices of starts (``sliced_scoring_bytes``): the largest slice of
    SLICE_STARTS that fits, whole-slice attention where that fits, else ATTENTION_MIN_BLOCK.
    ``prefer_sliced_from``: a document longer than this takes the sliced chain first, in slices of at
    least this many starts where they fit (each position's target probabilities then serve every depth
    instead of being recomputed per depth)."""
    chunks = [LOGITS_TOKENS >> i for i in range(8)]  # 2048 .. 16

    def sliced(rows: int, width: int, least: int) -> tuple | None:
        for starts in SLICE_STARTS:
            if starts < least or starts >= width and starts != SLICE_STARTS[-1]:
                continue
            for block in (None, ATTENTION_MIN_BLOCK):
                if sliced_at(rows, width, block, starts) <= budget:
                    return block, rows * starts, starts
        return None

    def how(rows: int, width: int) -> tuple | None:
        if sliced_at is not None and prefer_sliced_from is not None and width > prefer_sliced_from:
            plan = sliced(rows, width, prefer_sliced_from)
            if plan is not None:
                return plan
        plan = how_whole(rows, width)
        if plan is not None or sliced_at is None:
            return plan
        return sliced(rows, width, 1)

    def how_whole(rows: int, width: int) -> tuple[int | None, int] | None:
        for lt in chunks:
            if scratch_at(rows, width, None, lt) <= budget:
                return None, lt
        for lt in chunks:
            if scratch_at(rows, width, ATTENTION_MIN_BLOCK, lt) <= budget:
                cap = max(ATTENTION_MIN_BLOCK, ATTENTION_BLOCK_BYTES // max(1, rows * heads * (width + 16) * 4))
                lo, hi = ATTENTION_MIN_BLOCK, max(ATTENTION_MIN_BLOCK, min(width, cap))
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if scratch_at(rows, width, mid, lt) <= budget else (lo, mid - 1)
                return lo, lt
        return None

    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[Batch] = []
    current: list[int] = []

    def close() -> None:
        width = lengths[current[-1]]
        plan = how(len(current), width)
        if plan is None:
            least = scratch_at(1, width, ATTENTION_MIN_BLOCK, chunks[-1])
            if sliced_at is not None:
                least = min(least, sliced_at(1, width, ATTENTION_MIN_BLOCK, SLICE_STARTS[-1]))
            raise ProbeError(f"a {width}-token sequence needs about {least / 2**30:.2f} GiB of scoring scratch even with "
                             f"blocked attention, over the {max(budget, 0) / 2**30:.2f} GiB left beside the weights; "
                             "split the document or allow more memory", path=source or None)
        batches.append(Batch(tuple(current), width, *plan))

    def takes(rows: int, width: int) -> bool:
        """Whether a batch of ``rows`` grows to this width: only with the whole chain (or the preferred
        slices). Slices of fewer starts are the fallback of a sequence alone, never a reason to batch more
        rows: a batch grown on them runs its MTP layer a few starts at a time (25x slower on an H100)."""
        if sliced_at is not None and prefer_sliced_from is not None and width > prefer_sliced_from:
            if sliced(rows, width, prefer_sliced_from) is not None:
                return True
        return how_whole(rows, width) is not None

    for i in order:
        full = max_tokens is not None and (len(current) + 1) * lengths[i] > max_tokens
        if current and (len(current) + 1 > max_rows or full or not takes(len(current) + 1, lengths[i])):
            close()
            current = []
        current.append(i)
    if current:
        close()
    return batches


def score_all(main, head, sequences: list[Sequence], steps: int, *, mode: str, temperature: float,
              batches: list[Batch], pad_id: int, device, progress: bool, timings: dict[str, float] | None = None,
              hidden_for: Callable | None = None, peaks: dict[str, int] | None = None,
              kernels: set[str] | None = None) -> dict[str, Tally]:
    """Tallies per category over ``batches`` (``plan_batches``). ``hidden_for(indices, width)``
    supplies precomputed target hidden states for those sequences (streamed main model), else the
    main model runs per batch."""
    from tqdm import tqdm

    tallies: dict[str, Tally] = {}
    for plan in tqdm(batches, desc="forward+mtp", unit="batch", disable=not progress):
        batch = [sequences[j] for j in plan.indices]
        hidden = None if hidden_for is None else hidden_for(list(plan.indices), plan.width)
        for cat, t in score_batch(main, head, batch, steps, mode=mode, temperature=temperature,
                                  pad_id=pad_id, device=device, hidden=hidden, timings=timings,
                                  peaks=peaks, attention_block=plan.attention_block,
                                  logits_tokens=plan.logits_tokens, kernels=kernels,
                                  start_slice=plan.start_slice).items():
            tallies.setdefault(cat, Tally(steps)).merge(t)
    return tallies
