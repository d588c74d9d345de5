"""Replay of the greedy verify walk over a target-greedy sequence.

At temperature 0, speculative decoding emits exactly the target's greedy text, so one pass of the
chain over that text contains every draft a real decode would make; the walk picks the starts a
real decode reaches: begin where the prompt ends (the prefill produced x_P and the first drafts
sit on h_{P-1}), accept the leading drafts equal to the text (n), emit n + 1 tokens (correction or
bonus), jump to the new last position. A step is recorded only when all K drafts have a reference
token inside the sequence and the step's whole output (K drafts + bonus) fits in it: near the end a
real decode crops the step at max-new-tokens (transformers `_assisted_decoding` ``tokens_budget``),
so those tail steps are dropped rather than counted with a truncated window.
"""

from __future__ import annotations

import numpy as np


def match_matrix(drafts: np.ndarray, tokens: np.ndarray, length: int) -> np.ndarray:
    """``drafts`` [K, S] for one sequence, ``tokens`` [N]; -> bool [K, S] (False past the end)."""
    k_steps, seq = drafts.shape
    out = np.zeros((k_steps, seq), dtype=bool)
    for j in range(1, k_steps + 1):
        last = length - 2 - j  # start t needs t + j + 1 <= length - 1
        if last < 0:
            continue
        ref = tokens[j + 1: last + j + 2]
        out[j - 1, : last + 1] = drafts[j - 1, : last + 1] == ref
    return out


def leading_accepts(matches: np.ndarray) -> np.ndarray:
    """[K, S] -> [S] number of leading accepted drafts at each start."""
    run = np.cumprod(matches.astype(np.int64), axis=0)
    return run.sum(axis=0)


def verify_walk(matches: np.ndarray, prompt_len: int, length: int) -> list[int]:
    """Accepted drafts per verify step, starting at t = prompt_len - 1."""
    k_steps = matches.shape[0]
    accepted = leading_accepts(matches)
    steps: list[int] = []
    t = prompt_len - 1
    while t + k_steps + 2 <= length - 1:
        n = int(accepted[t])
        steps.append(n)
        t += n + 1
    return steps
