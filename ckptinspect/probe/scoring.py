"""Device memory of a run and the batched scoring loop (target forward -> MTP chain -> walk)."""

from __future__ import annotations

from typing import Callable

import torch

from ckptinspect.probe import loader
from ckptinspect.probe.evaluate import Sequence, score_batch
from ckptinspect.probe.metrics import Tally


def scoring_bytes(batch: int, seq: int, vocab: int, hidden: int, steps: int, dtype: torch.dtype,
                  heads: int = 0) -> int:
    """Peak scratch of scoring one batch (chain.py), the larger of its two phases plus the K
    side-by-side hidden streams held throughout:
    - logits: at each depth the draft and target logits at the compute dtype plus the float32
      softmaxes of sum(min(p, q)) (p, q and one temporary) over batch x seq x vocab;
    - attention at depth K: scores over the K*seq-long streams, batch x heads x (K*seq)^2 at the
      compute dtype plus their float32 softmax (SDPA's math path, which the chain's additive stream
      mask and MLA's unequal head dims lead to). Measured on an H200 (BENCHMARKS.md section 6, run 5):
      the chain phase peaks of a 16-head and a 32-head DeepSeek-V3 shape at batch 144 x 625 tokens
      were 1.02x / 0.98x this estimate; without the attention term, 32 heads ran 1.58x over it."""
    per = torch.tensor([], dtype=dtype).element_size()
    logits = batch * seq * vocab * (2 * per + 12)
    attention = batch * heads * (steps * seq) ** 2 * (per + 4)
    return max(logits, attention) + 4 * batch * seq * hidden * (steps + 1) * per


def decode_bytes(batch: int, top_k: int, expert_params: int, dtype: torch.dtype) -> int:
    """transformers' ``batched_mm`` experts (what ``generate`` decodes with on a GPU) gather a copy
    of each selected expert's weights per token: batch x top_k x one expert's params, transient."""
    return batch * top_k * expert_params * torch.tensor([], dtype=dtype).element_size()


def estimate_bytes(metas, dtype: torch.dtype, *, batch: int = 0, seq: int = 0, vocab: int = 0, hidden: int = 0,
                   steps: int = 1, heads: int = 0, decode: int = 0) -> int:
    """Device bytes of an in-memory run: the weights after dequantization at ``dtype``, the larger
    of the scoring scratch of the largest batch and the ``decode`` transient of generation, and
    256 MiB of allocator slack."""
    per = torch.tensor([], dtype=dtype).element_size()
    return (loader.logical_params(metas) * per
            + max(scoring_bytes(batch, seq, vocab, hidden, steps, dtype, heads), decode) + (256 << 20))


def score_all(main, head, sequences: list[Sequence], steps: int, *, mode: str, temperature: float,
              batch_size: int, pad_id: int, device, progress: bool, timings: dict[str, float] | None = None,
              hidden_for: Callable | None = None, peaks: dict[str, int] | None = None) -> dict[str, Tally]:
    """Tallies per category. ``hidden_for(indices, width)`` supplies precomputed target hidden
    states for those sequences (streamed main model), else the main model runs per batch."""
    from tqdm import tqdm

    tallies: dict[str, Tally] = {}
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].tokens))  # less padding per batch
    for i in tqdm(range(0, len(order), batch_size), desc="forward+mtp", unit="batch", disable=not progress):
        idx = order[i:i + batch_size]
        batch = [sequences[j] for j in idx]
        hidden = None if hidden_for is None else hidden_for(idx, max(len(s.tokens) for s in batch))
        for cat, t in score_batch(main, head, batch, steps, mode=mode, temperature=temperature,
                                  pad_id=pad_id, device=device, hidden=hidden, timings=timings,
                                  peaks=peaks).items():
            tallies.setdefault(cat, Tally(steps)).merge(t)
    return tallies
