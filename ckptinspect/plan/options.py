"""One (tp, ep) split evaluated on one GPU: divisibility checks, weights per GPU, static pool, KV capacity."""

from __future__ import annotations

from dataclasses import dataclass

from ckptinspect.plan.fit import CheckResult, run_checks
from ckptinspect.plan.gpus import GpuSpec
from ckptinspect.plan.kvcache import KvCapacity, MemFraction, kv_capacity, kv_cost, sglang_mem_fraction
from ckptinspect.plan.memory import Split, WeightMemory, weight_memory
from ckptinspect.plan.rules import PlanFacts, engine_rules
from ckptinspect.records import Checkpoint


@dataclass(frozen=True)
class Option:
    """One (tp, ep) split evaluated on the requested GPU."""

    memory: WeightMemory
    checks: tuple[CheckResult, ...]
    mem: MemFraction
    kv: KvCapacity

    @property
    def loads(self) -> bool:
        return not any(c.blocks for c in self.checks)

    @property
    def fits(self) -> bool:
        return self.kv.fits_one_request

    def why_not(self, gib: int) -> str:
        failed = [c.message for c in self.checks if c.blocks]
        if failed:
            return "; ".join(failed)
        if not self.fits:
            return (f"needs {self.kv.miss_bytes / gib:.1f} GiB more per GPU for weights + one {self.kv.context}-token "
                    f"request (weights {self.memory.total_bytes_per_rank / gib:.1f} GiB, static pool "
                    f"{self.mem.value:g} x GPU)")
        return ""


def evaluate(ck: Checkpoint, gpu: GpuSpec, facts: PlanFacts, tp: int, ep: int, context: int, kv_dtype: str,
             target: int, mtp_layers: int) -> Option:
    mem = sglang_mem_fraction(gpu, tp, facts)
    wm = weight_memory(ck, Split.sglang(tp, ep), with_mtp=facts.spec)
    gib = engine_rules("common")["planning"]["gib"]
    budget = int(gpu.memory_gib * gib * mem.value) - wm.total_bytes_per_rank
    cost = kv_cost(ck, tp, kv_dtype, extra_layers=mtp_layers if facts.spec else 0)
    return Option(wm, run_checks(ck, facts, tp, ep), mem, kv_capacity(budget, cost, context, target, kv_dtype))


def closeness(o: Option) -> tuple:
    # The option to explain when none works: fewest failed checks, then the smallest memory miss.
    return (o.loads, -sum(1 for c in o.checks if c.blocks), -o.kv.miss_bytes)


def ep_order(moe: bool, tp: int, goal: str) -> tuple[int, ...]:
    if not moe or tp == 1:
        return (1,)
    # Throughput favours EP (fewer all-reduces on the expert path); latency keeps plain TP first.
    return (tp, 1) if goal == "throughput" else (1, tp)
