"""One MTP layer chained K times over every start position of a sequence at once.

Sequence x_0..x_{N-1}, target post-norm hidden h_t. Start position t (S = N-1 of them):
  depth 1: input (h_t, emb(x_{t+1})) at position t+1, predicts x_{t+2};
  depth j: input (g_{j-1}(t), emb(d_{j-1}(t))) at position t+j, predicts x_{t+j+1},
where g / d are the layer's own output hidden / argmax token of the previous depth (SGLang
single-layer EAGLE: `srt/speculative/eagle_worker_v2.py` ``draft_forward``; vLLM reuses layer 0 the
same way, mtp_families.md §5.4). Position ids follow transformers' MtpModel (depth-1 query for h_t
sits at t+1); RoPE is relative, so the offset does not change scores.

Attention in a real decode: depth-1 entries of every accepted position are in the MTP KV cache
(draft-extend with the target hidden), and the depth-j query of the current step also sees its own
step's earlier depths. We reproduce that for all starts in one pass by laying the depth streams
side by side (length j*S): query (stream i, start t) sees stream-1 keys u <= t and the keys of
streams 2..i with the same start t (``stream_mask`` is that rule as a dense mask, the tests' reference).
Depth j keeps only stream j's outputs (the earlier streams' were kept at the earlier depths), so only
stream j's queries are attended and only its rows run the MLP / MoE; the earlier streams contribute
keys and values (stream_attention.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ckptinspect.probe.heads.base import MtpHead
from ckptinspect.probe.stream_attention import StartPrefix, streams_layout


@dataclass
class ChainOutput:
    drafts: torch.Tensor  # [K, B, S] argmax draft token of depth j at start t
    min_pq: torch.Tensor | None  # [K, B, S] sum_v min(p_draft, q_target) at temperature T (NaN: no target)
    target_argmax: torch.Tensor | None = None  # [B, N] the target's argmax at positions 1..N-1 (0 at position 0)
    attention_kernels: tuple[str, ...] = ()  # the causal kernels the streams' attention ran (stream_attention)


class PartClock:
    """Seconds per part of the chain (``chain_mtp_layer``, ``chain_draft_logits``, ``chain_compare``) without
    synchronizing inside it: CUDA events around each part, read once at the end (``add_to``)."""

    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list[tuple[str, object, object]] = []
        self.cpu: dict[str, float] = {}

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        import time

        return time.perf_counter()

    def part(self, name: str, start) -> object:
        end = self.mark()
        if self.cuda:
            self.marks.append((name, start, end))
        else:
            self.cpu[name] = self.cpu.get(name, 0.0) + end - start
        return end

    def add_to(self, timings: dict[str, float]) -> None:
        if self.cuda and self.marks:
            self.marks[-1][2].synchronize()
        for name, a, b in self.marks:
            timings[name] = timings.get(name, 0.0) + a.elapsed_time(b) / 1e3
        for name, v in self.cpu.items():
            timings[name] = timings.get(name, 0.0) + v


def stream_mask(depth: int, seq: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask [1, 1, depth*seq, depth*seq] for ``depth`` side-by-side streams (see module doc)."""
    t = torch.arange(seq, device=device)
    causal = t[None, :] <= t[:, None]  # [q, k] key u <= query t
    same = torch.eye(seq, dtype=torch.bool, device=device)
    blocks = []
    for qi in range(depth):
        row = []
        for ki in range(depth):
            if ki == 0:
                row.append(causal)
            elif ki <= qi:
                row.append(same)
            else:
                row.append(torch.zeros_like(same))
        blocks.append(torch.cat(row, dim=1))
    allowed = torch.cat(blocks, dim=0)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


# The chain's MLP / MoE block runs on at most this many stream positions at a time: its activations
# (top_k x expert widths per token, float32 combine) are the chain's largest per-token term, so a long
# document's chain is bounded by its hidden-size terms instead (scoring.scoring_bytes counts the same).
MLP_PIECE_TOKENS = 8192


@contextlib.contextmanager
def mlp_in_pieces(head: torch.nn.Module, tokens: int = MLP_PIECE_TOKENS, keep: int | None = None):
    """Inside: the head's ``mlp`` blocks (per-token functions: a dense MLP, or routed experts whose
    routing is per token) take [B, L, H] inputs ``tokens`` positions (all rows) at a time. ``keep``:
    only the last ``keep`` positions are computed, the rows before them are zeros (the chain keeps only
    its last stream, and a per-token function's kept rows do not depend on the others). A block that
    returns more than a tensor runs whole."""
    patched = []
    for name, module in head.named_modules():
        if name.rsplit(".", 1)[-1] != "mlp":
            continue
        original = module.forward

        def pieces(x, _original):
            if x.shape[0] * x.shape[1] <= tokens:
                return _original(x)
            piece = max(1, tokens // x.shape[0])
            outs = []
            for lo in range(0, x.shape[1], piece):
                out = _original(x[:, lo:lo + piece].contiguous())
                if not isinstance(out, torch.Tensor):
                    return None
                outs.append(out)
            return torch.cat(outs, dim=1)

        def forward(x, *args, _original=original, **kwargs):
            if args or kwargs or x.dim() != 3:
                return _original(x, *args, **kwargs)
            if keep is None or keep >= x.shape[1]:
                out = pieces(x, _original)
                return _original(x) if out is None else out
            tail = pieces(x[:, -keep:].contiguous(), _original)
            if not isinstance(tail, torch.Tensor):
                return _original(x)
            out = tail.new_zeros(x.shape[0], x.shape[1], *tail.shape[2:])
            out[:, -keep:] = tail
            return out

        patched.append((module, module.__dict__.get("forward")))
        module.forward = forward
    try:
        yield
    finally:
        for module, own in patched:
            if own is None:
                del module.forward
            else:
                module.forward = own


@torch.no_grad()
def run_chain(head: MtpHead, tokens: torch.Tensor, hidden: torch.Tensor, steps: int, *,
              target_logits_fn=None, temperature: float = 1.0, attention_block: int | None = None,
              logits_tokens: int = 2048, parts: dict[str, float] | None = None,
              start_slice: int | None = None) -> ChainOutput:
    """``tokens`` [B, N], ``hidden`` [B, N, H] (target, post-final-norm). Right padding is harmless:
    every query only attends earlier positions. ``attention_block``: where no fused kernel runs, the
    streams' attention (``stream_attention.streams_attention``) takes this many starts at a time (long
    documents; same numbers); None: all starts at once. Logits, drafts and sum(min(p, q)) are taken
    ``logits_tokens`` (batch rows x positions) at a time, so no batch x S x vocab tensor exists. The
    target's argmax at every position comes from depth 1's target logits (no pass of its own).
    ``parts``: seconds of the MTP layer, the draft logits + argmax and the comparison with the target
    (``PartClock``) are added to it. ``start_slice``: the starts are taken this many at a time, every
    depth of a slice before the next slice (``_run_sliced``): the chain's memory is then bounded by the
    slice, not the document, and each position's target probabilities serve every depth."""
    if start_slice is not None and start_slice < tokens.shape[1] - 1:
        return _run_sliced(head, tokens, hidden, steps, target_logits_fn=target_logits_fn, temperature=temperature,
                           attention_block=attention_block, width=max(1, start_slice), parts=parts)
    bsz, n = tokens.shape
    seq = n - 1
    origin = hidden.device
    device = head.device  # the MTP layer's GPU (differs from the hidden's when the main model is split)
    hidden = hidden.to(device)
    tokens = tokens.to(device)
    base_pos = torch.arange(1, seq + 1, device=device)[None].expand(bsz, seq)
    embs = [head.embed(tokens[:, 1:]).to(hidden.dtype)]
    hids = [hidden[:, :-1]]
    drafts, min_pq = [], []
    clock = PartClock(device) if parts is not None else None
    kernels: set[str] = set()
    target_argmax = (torch.zeros(bsz, n, dtype=torch.long, device=device) if target_logits_fn is not None else None)
    for depth in range(1, steps + 1):
        at = clock.mark() if clock else None
        emb = torch.cat(embs, dim=1)
        hid = torch.cat(hids, dim=1)
        pos = torch.cat([base_pos + i for i in range(depth)], dim=1)
        # Only the last stream (depth `depth`) is kept: its queries alone are attended
        # (stream_attention.streams_attention) and its rows alone go through the MLP / MoE.
        with streams_layout(head, depth, seq, attention_block or seq, kernels), mlp_in_pieces(head, keep=seq):
            out = head.step(emb, hid, pos, None)[:, -seq:]
        at = clock.part("chain_mtp_layer", at) if clock else None
        d = torch.empty(bsz, seq, dtype=torch.long, device=device)
        pq = torch.full((bsz, seq), float("nan"), device=device) if target_logits_fn is not None else None
        span = max(1, logits_tokens // bsz)
        for lo in range(0, seq, span):
            hi = min(seq, lo + span)
            logits = head.logits(out[:, lo:hi])
            d[:, lo:hi] = logits.argmax(dim=-1).to(device)
            at = clock.part("chain_draft_logits", at) if clock else None
            if pq is not None:
                _min_pq(pq, logits, target_logits_fn, depth, n, temperature, lo,
                        target_argmax if depth == 1 else None)
                at = clock.part("chain_compare", at) if clock else None
            del logits
        drafts.append(d)
        if pq is not None:
            min_pq.append(pq)
        embs.append(head.embed(d).to(hidden.dtype))
        hids.append(out.to(hidden.dtype))
    if clock:
        clock.add_to(parts)
    return ChainOutput(torch.stack(drafts).to(origin),
                       torch.stack([m.to(origin) for m in min_pq]) if min_pq else None,
                       None if target_argmax is None else target_argmax.to(origin), tuple(sorted(kernels)))


@torch.no_grad()
def _run_sliced(head: MtpHead, tokens: torch.Tensor, hidden: torch.Tensor, steps: int, *, target_logits_fn,
                temperature: float, attention_block: int | None, width: int,
                parts: dict[str, float] | None) -> ChainOutput:
    """``run_chain`` over ``width`` starts at a time. Depth j of starts t in [a, b) needs only: stream
    1's keys of starts <= t (the earlier slices' kept in a ``StartPrefix``, the buffer of one key row per
    start), and the same starts' streams 2..j, i.e. this slice's own earlier depths. So a slice runs
    all its depths before the next slice starts, and what exists at once is the slice's streams, its
    logits, and the document's stream-1 keys; the numbers are the whole-document chain's (the same
    keys, the same softmax, merged exactly: stream_attention.causal_attention_lse). The target's
    probabilities at positions a+1 .. b+K-1 are computed once per slice for all K depths (depth j
    compares starts a..b-1 with positions a+j..b+j-1), not once per depth."""
    bsz, n = tokens.shape
    seq = n - 1
    origin = hidden.device
    device = head.device
    tokens = tokens.to(device)
    drafts = torch.empty(steps, bsz, seq, dtype=torch.long, device=device)
    with_target = target_logits_fn is not None
    min_pq = torch.full((steps, bsz, seq), float("nan"), device=device) if with_target else None
    target_argmax = torch.zeros(bsz, n, dtype=torch.long, device=device) if with_target else None
    clock = PartClock(device) if parts is not None else None
    kernels: set[str] = set()
    prefix = StartPrefix(seq)
    for a in range(0, seq, width):
        b = min(seq, a + width)
        w = b - a
        at = clock.mark() if clock else None
        q = None
        if with_target:  # target positions a+1 .. min(n, b+K)-1: every depth's comparison of this slice
            q_logits = target_logits_fn(a + 1, min(n, b + steps))
            own = min(b + 1, n) - (a + 1)  # positions a+1 .. b: this slice's share of the argmax (depth 1's)
            target_argmax[:, a + 1:a + 1 + own] = q_logits[:, :own].argmax(dim=-1).to(device)
            q = _probs(q_logits.to(device), temperature)
            del q_logits
            at = clock.part("chain_compare", at) if clock else None
        first = hidden[:, a:b].to(device)
        embs = [head.embed(tokens[:, a + 1:b + 1]).to(first.dtype)]
        hids = [first]
        base_pos = torch.arange(a + 1, b + 1, device=device)[None].expand(bsz, w)
        for depth in range(1, steps + 1):
            emb = torch.cat(embs, dim=1)
            hid = torch.cat(hids, dim=1)
            pos = torch.cat([base_pos + i for i in range(depth)], dim=1)
            with streams_layout(head, depth, w, attention_block or w, kernels, prefix), mlp_in_pieces(head, keep=w):
                out = head.step(emb, hid, pos, None)[:, -w:]
            del emb, hid, pos
            at = clock.part("chain_mtp_layer", at) if clock else None
            logits = head.logits(out)
            d = logits.argmax(dim=-1).to(device)
            drafts[depth - 1, :, a:b] = d
            at = clock.part("chain_draft_logits", at) if clock else None
            valid = min(b, n - depth) - a  # starts t < b with t + depth <= n - 1
            if q is not None and valid > 0:
                p = _probs(logits[:, :valid], temperature)
                # q's row r is position a+1+r: depth j's starts a.. compare with positions a+j..
                min_pq[depth - 1, :, a:a + valid] = torch.minimum(
                    p, q[:, depth - 1:depth - 1 + valid], out=p).sum(dim=-1).to(device)
                del p
                at = clock.part("chain_compare", at) if clock else None
            del logits
            embs.append(head.embed(d).to(first.dtype))
            hids.append(out.to(first.dtype))
        del q, embs, hids, out
        prefix.offset = b
    if clock:
        clock.add_to(parts)
    return ChainOutput(drafts.to(origin), None if min_pq is None else min_pq.to(origin),
                       None if target_argmax is None else target_argmax.to(origin), tuple(sorted(kernels)))


def _min_pq(out: torch.Tensor, draft_logits: torch.Tensor, target_logits_fn, depth: int, n: int,
            temperature: float, lo: int, argmax_out: torch.Tensor | None = None) -> None:
    """Into ``out[:, lo:lo+w]``: sum_v min(p, q), p = draft at start t (predicting x_{t+depth+1}),
    q = target at position t+depth; starts past n-1-depth have no target position (left NaN).
    ``argmax_out`` [B, N]: the target's argmax at those positions is written into it too."""
    valid = min(lo + draft_logits.shape[1], n - depth) - lo  # starts t with t+depth <= n-1
    if valid <= 0:
        return
    q_logits = target_logits_fn(lo + depth, lo + depth + valid)
    if argmax_out is not None:
        argmax_out[:, lo + depth:lo + depth + valid] = q_logits.argmax(dim=-1).to(argmax_out.device)
    p = _probs(draft_logits[:, :valid], temperature)
    q = _probs(q_logits.to(p.device), temperature)
    # in place: one [w, vocab] float32 buffer less, one pass less over it
    out[:, lo:lo + valid] = torch.minimum(p, q, out=p).sum(dim=-1).to(out.device)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 softmax(logits / T). At T = 1 the kernel upcasts as it reads (no float32 copy of the
    logits first); else the division makes the one float32 copy that the softmax then reads."""
    t = max(temperature, 1e-6)
    if t == 1.0:
        return torch.softmax(logits, dim=-1, dtype=torch.float32)
    return torch.softmax(logits.float() / t, dim=-1)
