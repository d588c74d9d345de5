"""Acceptance statistics (definitions: docs/reference/acceptance_metrics.md §1-§4).

All rates are micro-averaged: counts summed over every scored position of every sequence, then
divided (SpecForge `eval/evaluator.py`), never averages of per-batch ratios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence


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

    def to_json(self) -> dict[str, Any]:
        verify_steps = sum(self.histogram)
        accepted = sum(n * h for n, h in enumerate(self.histogram))
        depths = []
        for j, d in enumerate(self.depth, start=1):
            walk_reached = sum(self.histogram[j - 1:])
            walk_acc = sum(self.histogram[j:])
            depths.append({
                "k": j,
                "conditional": _ratio(d.accepted, d.reached),
                "conditional_ci95": wilson(d.accepted, d.reached),
                "unconditional": _ratio(d.accepted, d.total),
                "unconditional_ci95": wilson(d.accepted, d.total),
                "reached": d.reached, "accepted": d.accepted, "scored": d.total,
                "walk_conditional": _ratio(walk_acc, walk_reached),
                "walk_unconditional": _ratio(walk_acc, verify_steps),
                "sampled_acceptance": (d.min_pq_sum / d.min_pq_n) if d.min_pq_n else None,
            })
        tau = (accepted + verify_steps) / verify_steps if verify_steps else None
        return {
            "sequences": self.sequences,
            "generated_tokens": self.generated_tokens,
            "verify_steps": verify_steps,
            "accepted_drafts": accepted,
            "histogram": list(self.histogram),
            # SGLang: generated tokens / verify steps (bonus included), metrics_reporter.py
            "accept_length_sglang": tau,
            # vLLM: 1 + accepted / drafts (one draft proposal per verify step), v1/spec_decode/metrics.py
            "accept_length_vllm": (1 + accepted / verify_steps) if verify_steps else None,
            "mean_accepted": (accepted / verify_steps) if verify_steps else None,
            "accept_rate": (accepted / (verify_steps * self.steps)) if verify_steps else None,
            "accept_length_by_steps": {str(k): self.accept_length_from_rates(k) for k in range(1, self.steps + 1)},
            "depths": depths,
        }


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None
