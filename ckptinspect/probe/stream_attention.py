"""The MTP chain's attention: only the kept stream's queries, without a dense (K*S)^2 mask.

``chain.py`` lays the K draft streams of a sequence side by side (length K*S): the query of stream i
at start t sees the stream-1 keys u <= t and the keys of streams 2..i with the same start t. The chain
keeps only the last stream's outputs (depth K's drafts; the earlier streams' hidden states were
computed at the earlier depths), so only the last stream's S queries are computed here, against the
keys and values of every stream:

- stream-1 keys: causal attention ``q @ k1^T`` (key u <= query t), through a fused SDPA kernel that
  also returns the log-sum-exp of the scores (``causal_attention_lse``), else float32 math in blocks of
  ``block`` queries (batch x heads x block x S scores at a time);
- the same-start keys of streams 2..K: one dot product per query (the diagonal);
- the two softmax parts merged exactly through the log-sum-exp (float32, max-subtracted).

The earlier streams' rows of the output are zeros (never read: the chain slices them off, and the MLP
runs only on the kept rows, ``chain.mlp_in_pieces``). The dense mask (``chain.stream_mask``) stays as
the definition the tests compare against: tests/test_probe_long.py.

The function is registered with transformers' ``AttentionInterface`` and selected only for the MTP
head's modules, only inside ``streams_layout`` (their configs' attention implementation is set and
restored around the step), so the head's own attention module (projections, rotary, Qwen's output
gate, MLA's unequal head dims, GQA) is transformers' code and only the score/softmax/value step
differs.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from ckptinspect.errors import ProbeError

NAME = "ckptinspect_draft_streams"
_LAYOUT: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("draft_streams", default=None)
_REGISTERED = False


def _register() -> None:
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, streams_attention)
        _REGISTERED = True


class StartPrefix:
    """Stream 1's keys and values of a document's starts, filled slice by slice (``chain.run_chain``
    with ``start_slice``): a slice's kept-stream queries see stream 1's keys of every start up to their
    own, the earlier slices' from here. Stream 1's input (target hidden, next token) is the same at every
    depth, so its keys are taken at depth 1 and reused by the deeper ones. One buffer per attention
    module, [B, h_kv, starts, D] at the keys' dtype, allocated at the first slice."""

    def __init__(self, starts: int) -> None:
        self.starts = starts
        self.offset = 0  # starts before the current slice
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def take(self, module, k: torch.Tensor, v: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stream 1's keys / values of starts 0 .. offset + slice (views of the buffer); at depth 1 the
        slice's own ``k`` / ``v`` are written into it first."""
        end = self.offset + k.shape[2]
        if depth == 1:
            if id(module) not in self.kv:
                self.kv[id(module)] = (k.new_empty(k.shape[0], k.shape[1], self.starts, k.shape[3]),
                                       v.new_empty(v.shape[0], v.shape[1], self.starts, v.shape[3]))
            bk, bv = self.kv[id(module)]
            bk[:, :, self.offset:end] = k
            bv[:, :, self.offset:end] = v
        bk, bv = self.kv[id(module)]
        return bk[:, :, :end], bv[:, :, :end]


@contextlib.contextmanager
def streams_layout(head: torch.nn.Module, depth: int, seq: int, block: int, kernels: set | None = None,
                   prefix: StartPrefix | None = None):
    """Inside: the head's attention modules compute ``streams_attention`` for ``depth`` streams of
    ``seq`` starts (``block`` starts at a time where no fused kernel runs); the names of the causal
    kernels that ran are added to ``kernels``. ``prefix``: the streams are one slice of a longer
    document's starts, whose earlier starts' stream-1 keys are in ``prefix`` (``StartPrefix``)."""
    _register()
    configs = {}
    for module in head.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation_internal"):
            configs[id(cfg)] = cfg
    saved = {k: c._attn_implementation_internal for k, c in configs.items()}
    token = _LAYOUT.set((depth, seq, max(1, block), kernels if kernels is not None else set(), prefix))
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
    with L = depth x seq; returns ([B, L, h, Dv], None) whose last ``seq`` rows (the last stream) are
    the attention output and whose earlier rows are zeros: the chain keeps only the last stream
    (``chain.run_chain`` slices ``[:, -seq:]``), so the earlier streams' queries are never computed."""
    layout = _LAYOUT.get()
    if layout is None:
        raise ProbeError("draft-stream attention called outside streams_layout (internal error)")
    for unsupported in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ProbeError(f"the MTP layer's attention uses {unsupported}, which the draft-stream attention does "
                             "not implement")
    if attention_mask is not None:
        raise ProbeError("draft-stream attention got a mask (internal error: the chain passes none)")
    depth, seq, block, kernels, prefix = layout
    bsz, heads, length, _ = query.shape
    if length != depth * seq or key.shape[2] != length:
        raise ProbeError(f"draft-stream attention: {length} queries / {key.shape[2]} keys for {depth} streams of "
                         f"{seq} (internal error)")
    groups = heads // key.shape[1]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    last = (depth - 1) * seq
    q = query[:, :, last:]  # the kept stream's queries only

    def expand(k, v):  # GQA groups expanded (for this call's keys only)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return k, v

    def kv(j, a=0, b=seq):  # stream j's keys / values of starts a..b-1
        return expand(key[:, :, j * seq + a:j * seq + b], value[:, :, j * seq + a:j * seq + b])

    if prefix is None:
        k1, v1 = kv(0)
        offset = 0
    else:  # a slice of the document's starts: stream 1's keys of the earlier slices come first
        k1, v1 = expand(*prefix.take(module, key[:, :, :seq], value[:, :, :seq], depth))
        offset = prefix.offset
    o1, lse1, kernel = causal_attention_lse(q, k1, v1, scale, block, offset)
    del k1, v1
    kernels.add(kernel)
    # Written straight in transformers' [B, L, h, Dv] layout (no transposed copy); the earlier streams'
    # rows stay zero (discarded by the chain).
    out = query.new_zeros(bsz, length, heads, value.shape[-1])
    if depth == 1:
        out[:, last:] = o1.transpose(1, 2).to(out.dtype)
        return out, None
    # Streams 2..depth: one key per query (the same start). softmax over the union of the causal keys and
    # these = a log-sum-exp merge: with Z1 = exp(lse1) the causal part's normaliser and o1 its normalised
    # output, out = (Z1 o1 + sum_j e^{s_j} v_j) / (Z1 + sum_j e^{s_j}); everything is shifted by the row
    # maximum so no exponential overflows. Float32, PIECE_ELEMENTS (batch x heads x starts x head size)
    # at a time: the float32 temporaries stay bounded whatever the document length.
    piece = max(1, PIECE_ELEMENTS // max(1, bsz * heads * max(q.shape[-1], value.shape[-1])))
    for a in range(0, seq, piece):
        b = min(seq, a + piece)
        qf = q[:, :, a:b].float() * scale
        same, vals = [], []
        for j in range(1, depth):
            k, v = kv(j, a, b)
            same.append((qf * k.float()).sum(-1))  # [B, h, W]
            vals.append(v)
        del qf
        top = lse1[:, :, a:b]
        for s_j in same:
            top = torch.maximum(top, s_j)
        w1 = (lse1[:, :, a:b] - top).exp()
        total = w1.clone()
        o = o1[:, :, a:b].float() * w1[..., None]
        for s_j, v in zip(same, vals):
            e_j = (s_j - top).exp()
            total += e_j
            o += e_j[..., None] * v.float()
        out[:, last + a:last + b] = (o / total[..., None]).transpose(1, 2).to(out.dtype)
    return out, None


# The same-start merge's float32 temporaries (a handful of [B, h, W, D] tensors) are made this many
# elements at a time (1 GiB of float32 each at most); scoring.scoring_bytes counts them.
PIECE_ELEMENTS = 1 << 28


def causal_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                         block: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Causal attention of q [B, h, S, D] over k [B, h, S, D], v [B, h, S, Dv] (query t sees keys
    u <= t) and its log-sum-exp [B, h, S] (float32) of the scaled scores, plus the kernel's name.
    ``offset``: the keys are ``offset`` longer than the queries, query t being key offset + t's
    position (a slice of a longer document): the ``offset`` earlier keys, seen by every query, are
    attended without a mask and merged with the causal part through the log-sum-exp (the fused
    kernels' causal mask is aligned to the first key, not the last).

    A fused kernel that returns the log-sum-exp does it in O(S) memory: on CUDA flash attention
    (half precision, equal head sizes after zero-padding v, head size <= 256) else the memory-efficient
    kernel, on CPU the flash kernel for CPU. These are torch's own SDPA kernels called through their
    aten ops, because the public ``scaled_dot_product_attention`` does not return the log-sum-exp the
    merge with the same-start keys needs. Where none runs (a shape or dtype it refuses) the float32
    math below computes the same numbers ``block`` queries at a time."""
    if offset:
        return _with_prefix(q, k, v, scale, block, offset)
    s, dv = q.shape[2], v.shape[-1]
    d = q.shape[-1]
    vp = v if dv == d else torch.nn.functional.pad(v, (0, d - dv))  # zero columns: sliced off the output
    if q.is_cuda:
        if q.dtype in (torch.float16, torch.bfloat16) and d <= 256:
            try:
                out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, vp, 0.0, True, False, scale=scale)
                return out[0][..., :dv], out[1][..., :s].float(), "flash"
            except RuntimeError:
                pass
        try:
            out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True,
                                                                          scale=scale)
            return out[0], out[1][..., :s].float(), "efficient"
        except RuntimeError:
            pass
    elif q.device.type == "cpu":
        try:
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, vp, 0.0, True, scale=scale)
            return out[0][..., :dv], out[1][..., :s].float(), "cpu_flash"
        except RuntimeError:
            pass
    return (*_causal_math(q, k, v, scale, block), "math")


def _with_prefix(q, k, v, scale, block, offset):
    """``causal_attention_lse`` with ``offset`` earlier keys: the fused kernels' causal part over the
    slice's own keys merged exactly with an unmasked part over the earlier ones (float32, the row
    maximum subtracted); the math path takes all keys with the offset mask."""
    o2, l2, kernel = causal_attention_lse(q, k[:, :, offset:], v[:, :, offset:], scale, block)
    if kernel == "math":
        del o2, l2
        return (*_causal_math(q, k, v, scale, block, offset), "math")
    o1, l1 = _full_lse(q, k[:, :, :offset], v[:, :, :offset], scale, kernel)
    top = torch.maximum(l1, l2)
    w1, w2 = (l1 - top).exp(), (l2 - top).exp()
    total = w1 + w2
    out = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / total[..., None]
    return out, top + total.log(), kernel


def _full_lse(q, k, v, scale, kernel):
    """Unmasked attention (every query sees every key) and its float32 log-sum-exp, through the same
    fused kernel the causal part took."""
    s, dv, d = q.shape[2], v.shape[-1], q.shape[-1]
    vp = v if dv == d else torch.nn.functional.pad(v, (0, d - dv))
    if kernel == "flash":
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, vp, 0.0, False, False, scale=scale)
        return out[0][..., :dv], out[1][..., :s].float()
    if kernel == "efficient":
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
        return out[0], out[1][..., :s].float()
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, vp, 0.0, False, scale=scale)
    return out[0][..., :dv], out[1][..., :s].float()


def _causal_math(q, k, v, scale, block, offset=0):
    """float32 causal attention and log-sum-exp, ``block`` queries at a time: one [B, h, W, b] float32
    buffer of scores at a time (exponentiated in place), as SDPA's math path computes it."""
    bsz, heads, s, _ = q.shape
    out = torch.empty(bsz, heads, s, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.empty(bsz, heads, s, dtype=torch.float32, device=q.device)
    starts = torch.arange(offset + s, device=q.device)
    block = max(1, block)
    for a in range(0, s, block):
        b = min(s, a + block)
        end = offset + b  # query offset + t sees keys u <= offset + t
        scores = (q[:, :, a:b].float() * scale) @ k[:, :, :end].float().transpose(-1, -2)
        scores.masked_fill_(starts[None, :end] > starts[offset + a:end, None], float("-inf"))
        top = scores.amax(-1, keepdim=True)
        scores.sub_(top).exp_()
        total = scores.sum(-1, keepdim=True)
        out[:, :, a:b] = (scores @ v[:, :, :end].float()) / total
        lse[:, :, a:b] = (total.log() + top)[..., 0]
        del scores
    return out, lse
