"""The MTP chain's attention without a dense (K*S)^2 mask, for long documents.

``chain.py`` lays the K draft streams of a sequence side by side (length K*S) and masks them so that
the query of stream i at start t sees the stream-1 keys u <= t and the keys of streams 2..i with the
same start t (``chain.stream_mask``). That dense mask and the scores behind it grow with (K*S)^2:
a 32k-token document at K = 3 needs ~9 G entries per head. The same attention, computed here in
blocks of starts, needs batch x heads x block x (S + K) scores at a time:

- stream-1 keys: a causal block ``q[a:b] @ k1[:b]^T`` (keys past the query's start masked);
- the same-start keys of streams 2..i: one dot product per query (the diagonal);
- one softmax over both parts (float32, max-subtracted, as SDPA's math path computes it), then the
  weighted values; one float32 buffer of scores per block, exponentiated in place.

The function is registered with transformers' ``AttentionInterface`` and selected only for the MTP
head's modules, only inside ``streams_layout`` (their configs' attention implementation is set and
restored around the step), so the head's own attention module (projections, rotary, Qwen's output
gate, MLA's unequal head dims, GQA) is transformers' code and only the score/softmax/value step
differs. Equal to the dense path: tests/test_probe_long.py.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from ckptinspect.errors import ProbeError

NAME = "ckptinspect_draft_streams"
_LAYOUT: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar("draft_streams", default=None)
_REGISTERED = False


def _register() -> None:
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, streams_attention)
        _REGISTERED = True


@contextlib.contextmanager
def streams_layout(head: torch.nn.Module, depth: int, seq: int, block: int):
    """Inside: the head's attention modules compute ``streams_attention`` for ``depth`` streams of
    ``seq`` starts, ``block`` starts at a time."""
    _register()
    configs = {}
    for module in head.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation_internal"):
            configs[id(cfg)] = cfg
    saved = {k: c._attn_implementation_internal for k, c in configs.items()}
    token = _LAYOUT.set((depth, seq, max(1, block)))
    try:
        for cfg in configs.values():  # the internal field: the property's setter would recurse into sub-configs
            cfg._attn_implementation_internal = NAME
        yield
    finally:
        for k, cfg in configs.items():
            cfg._attn_implementation_internal = saved[k]
        _LAYOUT.reset(token)


def streams_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                      dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: query [B, h, L, D], key / value [B, h_kv, L, D*]
    with L = depth x seq; returns ([B, L, h, Dv], None)."""
    layout = _LAYOUT.get()
    if layout is None:
        raise ProbeError("draft-stream attention called outside streams_layout (internal error)")
    for unsupported in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ProbeError(f"the MTP layer's attention uses {unsupported}, which the long-document path does not "
                             "implement; shorten the documents so the dense path fits")
    if attention_mask is not None:
        raise ProbeError("draft-stream attention got a mask (internal error: the chain passes none)")
    depth, seq, block = layout
    bsz, heads, length, _ = query.shape
    if length != depth * seq or key.shape[2] != length:
        raise ProbeError(f"draft-stream attention: {length} queries / {key.shape[2]} keys for {depth} streams of "
                         f"{seq} (internal error)")
    groups = heads // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = torch.empty(bsz, heads, length, value.shape[-1], dtype=query.dtype, device=query.device)
    starts = torch.arange(seq, device=query.device)
    for i in range(depth):
        for a in range(0, seq, block):
            b = min(seq, a + block)
            q = query[:, :, i * seq + a:i * seq + b].float() * scale
            # one [B, h, W, b] float32 buffer: scores, then in place their exponentials
            scores = q @ key[:, :, :b].float().transpose(-1, -2)
            scores.masked_fill_(starts[None, :b] > starts[a:b, None], float("-inf"))
            same = [(q * key[:, :, j * seq + a:j * seq + b].float()).sum(-1, keepdim=True)
                    for j in range(1, i + 1)]  # [B, h, W, 1] each
            top = scores.amax(-1, keepdim=True)
            for s_j in same:
                top = torch.maximum(top, s_j)
            scores.sub_(top).exp_()
            same = [(s_j - top).exp() for s_j in same]
            total = scores.sum(-1, keepdim=True)
            o = scores @ value[:, :, :b].float()
            del scores
            for j, e_j in enumerate(same, start=1):
                total += e_j
                o += e_j * value[:, :, j * seq + a:j * seq + b].float()
            out[:, :, i * seq + a:i * seq + b] = (o / total).to(out.dtype)
    return out.transpose(1, 2).contiguous(), None
