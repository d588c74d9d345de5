"""Device memory of a run and the batched scoring loop (target forward -> MTP chain -> walk)."""

from __future__ import annotations

from typing import Callable

import torch

from ckptinspect.probe import loader
from ckptinspect.probe.evaluate import Sequence, score_batch
from ckptinspect.probe.metrics import Tally


def scoring_bytes(batch: int, seq: int, vocab: int, hidden: int, steps: int, dtype: torch.dtype) -> int:
    """Peak scratch of scoring one batch (chain.py): at each depth the draft logits and the target
    logits at the compute dtype plus the float32 softmaxes of sum(min(p, q)) (p, q and one
    temporary) over batch x seq x vocab, and the K side-by-side hidden streams."""
    per = torch.tensor([], dtype=dtype).element_size()
    return batch * seq * vocab * (2 * per + 12) + 4 * batch * seq * hidden * (steps + 1) * per


def estimate_bytes(metas, dtype: torch.dtype, *, batch: int = 0, seq: int = 0, vocab: int = 0, hidden: int = 0,
                   steps: int = 1) -> int:
    """Device bytes of an in-memory run: the weights after dequantization at ``dtype``, the
    scoring scratch of the largest batch, and 256 MiB of allocator slack."""
    per = torch.tensor([], dtype=dtype).element_size()
    return (loader.logical_params(metas) * per + scoring_bytes(batch, seq, vocab, hidden, steps, dtype)
            + (256 << 20))


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
