"""Acceptance statistics (definitions: docs/reference/acceptance_metrics.md §1-§4).

All rates are micro-averaged: counts summed over every scored position of every sequence, then
divided (SpecForge `eval/evaluator.py`), never averages of per-batch ratios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float] | None:
    """Wilson score interval (95% by default) for a binomial proportion."""
    if trials <= 0:
        return None
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class DepthCounts:
    """Counts for one depth j over all teacher-forced starts (conditional and unconditional)."""

    reached: int = 0  # starts where drafts 1..j-1 were all accepted
    accepted: int = 0  # starts where drafts 1..j were all accepted
    total: int = 0  # all scored starts
    min_pq_sum: float = 0.0  # sum of sum_v min(p, q) over reached starts
    min_pq_n: int = 0


@dataclass
class Tally:
    """Everything counted for one group of sequences (all, or one prompt category)."""

    steps: int
    depth: list[DepthCounts] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)  # verify steps with exactly n accepted
    sequences: int = 0
    generated_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.depth:
            self.depth = [DepthCounts() for _ in range(self.steps)]
        if not self.histogram:
            self.histogram = [0] * (self.steps + 1)

    def add_walk(self, accepted_per_step: Sequence[int]) -> None:
        for n in accepted_per_step:
            self.histogram[n] += 1

    def merge(self, other: "Tally") -> None:
        for a, b in zip(self.depth, other.depth):
            a.reached += b.reached
            a.accepted += b.accepted
            a.total += b.total
            a.min_pq_sum += b.min_pq_sum
            a.min_pq_n += b.min_pq_n
        self.histogram = [x + y for x, y in zip(self.histogram, other.histogram)]
        self.sequences += other.sequences
        self.generated_tokens += other.generated_tokens

    # ---- derived ---------------------------------------------------------------------------
    def conditional(self) -> list[float | None]:
        return [d.accepted / d.reached if d.reached else None for d in self.depth]

    def accept_length_from_rates(self, k: int) -> float | None:
        """tau(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j (teacher-forced alpha)."""
        tau, prod = 1.0, 1.0
        for alpha in self.conditional()[:k]:
            if alpha is None:
                return None
            prod *= alpha
            tau += prod
        return tau

    def verify_steps(self) -> int:
        return sum(self.histogram)

    def accepted_drafts(self) -> int:
        return sum(n * h for n, h in enumerate(self.histogram))

    def accept_length_sglang(self) -> float | None:
        """SGLang: generated tokens / verify steps, the bonus token included (metrics_reporter.py)."""
        steps = self.verify_steps()
        return (self.accepted_drafts() + steps) / steps if steps else None

    def accept_length_vllm(self) -> float | None:
        """vLLM: 1 + accepted / drafts, one draft proposal per verify step (v1/spec_decode/metrics.py)."""
        steps = self.verify_steps()
        return 1 + self.accepted_drafts() / steps if steps else None

    def walk_rates(self, j: int) -> tuple[float | None, float | None]:
        """Depth ``j``'s acceptance in the replayed verify walk: (given depth j was reached, per step)."""
        reached, accepted = sum(self.histogram[j - 1:]), sum(self.histogram[j:])
        return _ratio(accepted, reached), _ratio(accepted, self.verify_steps())


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None
