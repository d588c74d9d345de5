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
side by side (length j*S) with a mask: query (stream i, start t) sees stream-1 keys u <= t and the
keys of streams 2..i with the same start t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptinspect.probe.heads.base import MtpHead


@dataclass
class ChainOutput:
    drafts: torch.Tensor  # [K, B, S] argmax draft token of depth j at start t
    min_pq: torch.Tensor | None  # [K, B, S] sum_v min(p_draft, q_target) at temperature T (NaN: no target)


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


@torch.no_grad()
def run_chain(head: MtpHead, tokens: torch.Tensor, hidden: torch.Tensor, steps: int, *,
              target_logits_fn=None, temperature: float = 1.0, attention_block: int | None = None,
              logits_tokens: int = 2048) -> ChainOutput:
    """``tokens`` [B, N], ``hidden`` [B, N, H] (target, post-final-norm). Right padding is harmless:
    every query only attends earlier positions. ``attention_block``: compute the streams' attention
    ``stream_attention.streams_attention`` this many starts at a time instead of through the dense
    mask (long documents; same numbers). Logits, drafts and sum(min(p, q)) are taken
    ``logits_tokens`` (batch rows x positions) at a time, so no batch x S x vocab tensor exists."""
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
    for depth in range(1, steps + 1):
        emb = torch.cat(embs, dim=1)
        hid = torch.cat(hids, dim=1)
        pos = torch.cat([base_pos + i for i in range(depth)], dim=1)
        if attention_block:
            from ckptinspect.probe.stream_attention import streams_layout

            with streams_layout(head, depth, seq, attention_block):
                out = head.step(emb, hid, pos, None)[:, -seq:]
        else:
            mask = stream_mask(depth, seq, hidden.dtype, device).expand(bsz, -1, -1, -1)
            out = head.step(emb, hid, pos, mask)[:, -seq:]
        d = torch.empty(bsz, seq, dtype=torch.long, device=device)
        pq = torch.full((bsz, seq), float("nan"), device=device) if target_logits_fn is not None else None
        span = max(1, logits_tokens // bsz)
        for lo in range(0, seq, span):
            hi = min(seq, lo + span)
            logits = head.logits(out[:, lo:hi])
            d[:, lo:hi] = logits.argmax(dim=-1).to(device)
            if pq is not None:
                _min_pq(pq, logits, target_logits_fn, depth, n, temperature, lo)
            del logits
        drafts.append(d)
        if pq is not None:
            min_pq.append(pq)
        embs.append(head.embed(d).to(hidden.dtype))
        hids.append(out.to(hidden.dtype))
    return ChainOutput(torch.stack(drafts).to(origin),
                       torch.stack([m.to(origin) for m in min_pq]) if min_pq else None)


def _min_pq(out: torch.Tensor, draft_logits: torch.Tensor, target_logits_fn, depth: int, n: int,
            temperature: float, lo: int) -> None:
    """Into ``out[:, lo:lo+w]``: sum_v min(p, q), p = draft at start t (predicting x_{t+depth+1}),
    q = target at position t+depth; starts past n-1-depth have no target position (left NaN)."""
    valid = min(lo + draft_logits.shape[1], n - depth) - lo  # starts t with t+depth <= n-1
    if valid <= 0:
        return
    q_logits = target_logits_fn(lo + depth, lo + depth + valid)
    t = max(temperature, 1e-6)
    p = torch.softmax(draft_logits[:, :valid].float() / t, dim=-1)
    q = torch.softmax(q_logits.to(p.device).float() / t, dim=-1)
    out[:, lo:lo + valid] = torch.minimum(p, q).sum(dim=-1).to(out.device)
