"""Score sequences: target forward -> MTP chain -> per-depth counts and verify-walk histogram."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe.chain import run_chain
from ckptinspect.probe.heads.base import MtpHead
from ckptinspect.probe.metrics import Tally
from ckptinspect.probe.walk import verify_walk


@dataclass(frozen=True)
class Sequence:
    category: str
    tokens: tuple[int, ...]  # prompt + continuation (greedy mode) or the corpus text (teacher mode)
    prompt_len: int  # scoring starts at t = prompt_len - 1 (never on prompt positions or position 0)


@torch.no_grad()
def target_hidden(main, tokens: torch.Tensor) -> torch.Tensor:
    """Post-final-norm last hidden state (what SGLang / vLLM / transformers feed the MTP layer,
    mtp_families.md §5.1). Right padding is harmless for causal models."""
    out = main.get_decoder()(input_ids=tokens, use_cache=False)
    return out.last_hidden_state


def score_batch(main, head: MtpHead, batch: list[Sequence], steps: int, *, mode: str, temperature: float,
                pad_id: int, device, hidden: torch.Tensor | None = None, with_target: bool = True,
                timings: dict[str, float] | None = None, peaks: dict[str, int] | None = None,
                attention_block: int | None = None, logits_tokens: int = 2048,
                kernels: set[str] | None = None, start_slice: int | None = None) -> dict[str, Tally]:
    """Counts per category for one batch of sequences (tallies are merged by the caller).

    ``hidden``: target hidden states supplied from outside (``--main-url``, streamed layers);
    ``with_target`` False when the main model's logits are not available (no sampled-acceptance
    estimate, greedy mode only). ``timings`` accumulates seconds per phase (hidden_forward,
    mtp_chain, walk), the device synchronized at each boundary; ``peaks`` the highest device memory
    allocated in each phase (CUDA only). ``attention_block`` / ``logits_tokens``: see ``chain.run_chain``.
    ``kernels``: the names of the causal attention kernels the chain ran are added to it.
    ``start_slice``: the chain in slices of this many starts (``chain.run_chain``).
    """
    clock = _Clock(timings, device, peaks)
    n = max(len(s.tokens) for s in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    for i, s in enumerate(batch):
        ids[i, : len(s.tokens)] = torch.tensor(s.tokens)
    ids = ids.to(device)
    if hidden is None:
        hidden = target_hidden(main, ids)
        clock.lap("hidden_forward")
    if not torch.isfinite(hidden).all():
        raise ProbeError("the main model produced non-finite hidden states (NaN/inf): check the weights "
                         "or use --dtype fp32")
    lm_head = main.get_output_embeddings()

    def target_logits(start: int, end: int) -> torch.Tensor:
        return lm_head(hidden[:, start:end])

    chain = run_chain(head, ids, hidden, steps, target_logits_fn=target_logits if with_target else None,
                      temperature=temperature, attention_block=attention_block, logits_tokens=logits_tokens,
                      parts=timings, start_slice=start_slice)
    if kernels is not None:
        kernels.update(chain.attention_kernels)
    drafts = chain.drafts.cpu().numpy()  # [K, B, S]
    min_pq = chain.min_pq.cpu().numpy() if chain.min_pq is not None else None
    # the target's argmax (positions >= 1; scoring never reads position 0) from the chain's depth-1 comparison
    argmax = (chain.target_argmax.cpu().numpy() if chain.target_argmax is not None
              else np.zeros((len(batch), n), dtype=np.int64))
    clock.lap("mtp_chain")
    tallies: dict[str, Tally] = {}
    for b, seq in enumerate(batch):
        tally = tallies.setdefault(seq.category, Tally(steps))
        score_sequence(tally, seq, drafts[:, b], argmax[b], None if min_pq is None else min_pq[:, b], mode)
    clock.lap("walk")
    return tallies


class _Clock:
    """Adds wall seconds since the last lap to ``timings[phase]`` (no-op without a dict), and on CUDA
    the phase's peak allocated bytes to ``peaks[phase]`` (the maximum over batches)."""

    def __init__(self, timings: dict[str, float] | None, device, peaks: dict[str, int] | None = None) -> None:
        import time

        self.timings, self.device, self._time, self.peaks = timings, torch.device(device), time.perf_counter, peaks
        self.last = self._time()
        if peaks is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def lap(self, phase: str) -> None:
        if self.peaks is not None and self.device.type == "cuda":
            self.peaks[phase] = max(self.peaks.get(phase, 0), torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.timings is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = self._time()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
        self.last = now


def score_sequence(tally: Tally, seq: Sequence, drafts: np.ndarray, argmax: np.ndarray,
                   min_pq: np.ndarray | None, mode: str) -> None:
    """drafts [K, S]; argmax [N] (target argmax at each position); min_pq [K, S].

    Depth j at start t predicts sequence index t+j+1. ``hit`` = the draft equals what the target
    would emit there; ``consistent`` = the draft equals the sequence token, so the next depth's
    context is the one the target saw. Greedy mode: the sequence *is* the target's greedy output,
    both reduce to ``draft == token`` (exactly what greedy verification checks). Teacher mode: text
    is a corpus, the target's argmax is the reference.
    """
    k_steps = drafts.shape[0]
    length = len(seq.tokens)
    tokens = np.asarray(seq.tokens)
    first = seq.prompt_len - 1
    last = length - k_steps - 2  # every depth has a reference token
    tally.sequences += 1
    tally.generated_tokens += max(0, length - seq.prompt_len)
    if last < first:
        return
    starts = np.arange(first, last + 1)
    hit = np.zeros((k_steps, len(starts)), dtype=bool)
    cons = np.zeros_like(hit)
    for j in range(1, k_steps + 1):
        d = drafts[j - 1, starts]
        cons[j - 1] = d == tokens[starts + j + 1]
        hit[j - 1] = cons[j - 1] if mode == "greedy" else d == argmax[starts + j]
    reached = np.ones(len(starts), dtype=bool)
    for j in range(k_steps):
        dc = tally.depth[j]
        acc = reached & hit[j]
        dc.total += len(starts)
        dc.reached += int(reached.sum())
        dc.accepted += int(acc.sum())
        if min_pq is not None:
            vals = min_pq[j, starts][reached]
            vals = vals[~np.isnan(vals)]
            dc.min_pq_sum += float(vals.sum())
            dc.min_pq_n += int(vals.size)
        reached = acc & cons[j]
    if mode == "greedy":
        full = np.zeros((k_steps, drafts.shape[1]), dtype=bool)
        full[:, starts] = hit
        tally.add_walk(verify_walk(full, seq.prompt_len, length))
