"""Max-context solver: the longest context N concurrent requests get on one (tp, ep) split.

Used when the default settings cannot hold one full-context request, and on request
(`plan --max-context`). The candidate changes and their risks are data
(rules/engines/sglang.yaml `max_context`); each is cumulative on the previous one. This module
evaluates them against the one memory model (plan/memory.py) and the KV models (plan/kvcache.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptinspect.plan.backends import arch_class
from ckptinspect.plan.gpus import GpuSpec
from ckptinspect.plan.kvcache import KvCost, MemFraction, kv_cost, sglang_mem_fraction
from ckptinspect.plan.memory import Split, WeightMemory, weight_memory
from ckptinspect.plan.rules import PlanFacts, engine_rules
from ckptinspect.records import Checkpoint


@dataclass(frozen=True)
class SolverStep:
    id: str  # "defaults" or a candidate id
    risk: str  # "" for the defaults
    source: str
    kv_dtype: str
    mem: MemFraction
    spec: bool
    weights: WeightMemory
    cost: KvCost
    budget_bytes: int  # static pool minus weights, per GPU
    max_context: int  # 0 when not even min_context fits
    skipped: str = ""  # why a candidate did not apply here
    last_resort: bool = False  # considered only when no other step runs


@dataclass(frozen=True)
class ContextSolution:
    concurrency: int
    requested: int
    min_context: int
    steps: tuple[SolverStep, ...]
    chosen: SolverStep | None  # None: nothing runs

    @property
    def shortfall_bytes(self) -> int:
        """Bytes per GPU missing for min_context x concurrency under the most permissive step."""
        applied = [s for s in self.steps if not s.skipped]
        best = max(applied, key=lambda s: s.budget_bytes)
        need = self.concurrency * best.cost.request_bytes(self.min_context)
        return max(int(need - best.budget_bytes), 0)


def longest_context(budget: int, cost: KvCost, concurrency: int, limit: int) -> int:
    """Largest L <= limit with concurrency x request_bytes(L) <= budget (0 when even L = 1 does not fit)."""
    if concurrency * cost.request_bytes(1) > budget:
        return 0
    lo, hi = 1, limit
    while lo < hi:  # request_bytes is non-decreasing in L
        mid = (lo + hi + 1) // 2
        if concurrency * cost.request_bytes(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fp8_kv_supported(facts: PlanFacts, attention_backend: str | None) -> str:
    """"" when this GPU and attention backend read an FP8 KV cache, else why not."""
    rules = engine_rules("sglang")
    valid = rules["settings"]["kv_cache_dtype"]["valid"].get(arch_class("sglang", facts.arch), [])
    if "fp8_e4m3" not in valid:
        return f"no FP8 KV cache on {facts.arch}"
    backends = rules["kv_fp8_backends"]["mla" if facts.attention == "mla" else "other"]
    if attention_backend not in backends:
        return (f"attention backend {attention_backend} has no FP8 KV cache for {facts.attention} "
                f"({rules['kv_fp8_backends']['source']})")
    return ""


def solve_max_context(ck: Checkpoint, gpu: GpuSpec, facts: PlanFacts, split: Split, *, kv_dtype: str,
                      attention_backend: str | None, mtp_layers: int, concurrency: int,
                      requested: int) -> ContextSolution:
    rules = engine_rules("sglang")["max_context"]
    gib = engine_rules("common")["planning"]["gib"]
    min_context = min(rules["min_context"], requested)

    def step(step_id: str, risk: str, source: str, kv: str, mem: MemFraction, spec: bool, skipped: str = "",
             last_resort: bool = False) -> SolverStep:
        weights = weight_memory(ck, split, with_mtp=spec)
        cost = kv_cost(ck, split.attn_tp, kv, extra_layers=mtp_layers if spec else 0)
        budget = int(gpu.memory_gib * gib * mem.value) - weights.total_bytes_per_rank
        best = longest_context(budget, cost, concurrency, requested)
        return SolverStep(step_id, risk, source, kv, mem, spec, weights, cost, budget,
                          best if best >= min_context else 0, skipped, last_resort)

    current = step("defaults", "", "SGLang defaults + rules/engines/sglang.yaml", kv_dtype,
                   sglang_mem_fraction(gpu, split.attn_tp, facts), facts.spec)
    steps = [current]
    for cand in rules["candidates"]:
        change, why_not = cand["change"], ""
        kv, mem, spec = current.kv_dtype, current.mem, current.spec
        if "kv_cache_dtype" in change:
            why_not = ("already " + kv) if kv == change["kv_cache_dtype"] else fp8_kv_supported(facts, attention_backend)
            kv = kv if why_not else change["kv_cache_dtype"]
        if change.get("mem_fraction") == "formula":
            uncapped = sglang_mem_fraction(gpu, split.attn_tp, facts, chunked_prefill=mem.chunked_prefill_size,
                                           capped=False)
            why_not = "" if uncapped.value > mem.value else "no field cap below SGLang's own value"
            mem = mem if why_not else uncapped
        if "chunked_prefill_divisor" in change:
            smaller = max(mem.chunked_prefill_size // change["chunked_prefill_divisor"], change["min_chunked_prefill"])
            lifted = sglang_mem_fraction(gpu, split.attn_tp, facts, chunked_prefill=smaller, capped=False)
            why_not = "" if lifted.value > mem.value else "a smaller chunk frees no memory on this GPU (reserve floor)"
            mem = mem if why_not else lifted
        if change.get("speculative") is False:
            why_not = "" if spec else "no MTP draft loaded"
            spec = False
        nxt = step(cand["id"], cand["risk"], cand["source"], kv, mem, spec, why_not, cand.get("last_resort", False))
        steps.append(nxt)
        if not why_not:
            current = nxt
    return ContextSolution(concurrency, requested, min_context, tuple(steps), _pick(steps, requested))


def _pick(steps: list[SolverStep], requested: int) -> SolverStep | None:
    applied = [s for s in steps if not s.skipped and s.max_context]
    if any(not s.last_resort for s in applied):
        applied = [s for s in applied if not s.last_resort]
    if not applied:
        return None
    reaching = [s for s in applied if s.max_context >= requested]
    return reaching[0] if reaching else max(applied, key=lambda s: s.max_context)

