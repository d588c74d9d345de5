"""make_plan: checkpoint + MTP verdicts + GPU -> TP/EP, memory, KV capacity and launch commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ckptinspect.errors import PlanError
from ckptinspect.plan.backends import Choice, choose, parsers_for
from ckptinspect.plan.command import Command, LaunchInputs
from ckptinspect.plan.fit import CheckResult, run_checks
from ckptinspect.plan.gpus import GpuSpec, find_gpu
from ckptinspect.plan.kvcache import (KvCapacity, MemFraction, kv_bytes_per_token, kv_capacity,
                                      sglang_mem_fraction, state_bytes_per_request)
from ckptinspect.plan.memory import WeightMemory, mtp_dtypes, weight_memory
from ckptinspect.plan.rules import Facts, engine_rules, first_match
from ckptinspect.plan.sglang import sglang_command
from ckptinspect.plan.vllm import vllm_command
from ckptinspect.records import Checkpoint, MtpAssessment

GOALS = ("latency", "throughput")
ENGINES = ("sglang", "vllm", "both")
SPEC_VERDICTS = ("ready", "degraded")


@dataclass(frozen=True)
class Option:
    """One (tp, ep) split evaluated on the requested GPU."""

    memory: WeightMemory
    checks: tuple[CheckResult, ...]
    mem: MemFraction
    kv: KvCapacity

    @property
    def loads(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def fits(self) -> bool:
        return self.kv.fits_one_request

    def why_not(self, gib: int) -> str:
        failed = [c.message for c in self.checks if not c.ok]
        if failed:
            return "; ".join(failed)
        if not self.fits:
            return (f"needs {self.kv.miss_bytes / gib:.1f} GiB more per GPU for weights + one {self.kv.context}-token "
                    f"request (weights {self.memory.total_bytes_per_rank / gib:.1f} GiB, static pool "
                    f"{self.mem.value:g} x GPU)")
        return ""

    def to_json(self, gib: int) -> dict[str, Any]:
        return {**self.memory.to_json(gib), "loads": self.loads, "fits": self.fits,
                "failed_checks": [c.to_json() for c in self.checks if not c.ok],
                "kv_tokens": self.kv.tokens, "miss_gib": round(self.kv.miss_bytes / gib, 2)}


@dataclass(frozen=True)
class Note:
    severity: str
    message: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "message": self.message, "source": self.source}


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: GpuSpec
    gpus: int
    context: int
    goal: str
    engines: tuple[str, ...]
    quant_kind: str
    quant_label: str | None
    attention_kind: str
    moe: bool
    chosen: Option
    parallel_reason: str
    options: tuple[Option, ...]
    min_gpus: int | None
    min_gpus_reason: str
    mtp_dtypes: Mapping[str, int]
    mtp_verdicts: Mapping[str, Any]
    speculative: Mapping[str, Any]
    commands: Mapping[str, Command]
    notes: tuple[Note, ...]
    gib: int

    def to_json(self) -> dict[str, Any]:
        g, c = self.gib, self.chosen
        return {
            "schema_version": 1,
            "model": self.model, "gpu": self.gpu.to_json(), "gpus": self.gpus, "context": self.context,
            "goal": self.goal, "engines": list(self.engines),
            "quantization": {"kind": self.quant_kind, "label": self.quant_label},
            "attention_kind": self.attention_kind, "moe": self.moe,
            "parallel": {"tp": c.memory.tp, "ep": c.memory.ep, "reason": self.parallel_reason},
            "memory": {
                **c.memory.to_json(g),
                "mtp_dtypes_gib": {k: round(v / g, 3) for k, v in self.mtp_dtypes.items()},
                "gpu_memory_gib": self.gpu.memory_gib,
                "mem_fraction_static": c.mem.value, "mem_fraction_formula": c.mem.formula,
                "mem_fraction_cap": c.mem.cap_reason, "reserved_mib": round(c.mem.reserved_mib),
                "static_pool_gib_per_gpu": round(self.gpu.memory_gib * c.mem.value, 2),
            },
            "kv_cache": c.kv.to_json(g),
            "checks": [x.to_json() for x in c.checks],
            "options": [o.to_json(g) for o in self.options],
            "min_gpus": {"count": self.min_gpus, "why_smaller_fails": self.min_gpus_reason or None},
            "mtp": dict(self.mtp_verdicts),
            "speculative": dict(self.speculative),
            "commands": {k: v.to_json() for k, v in self.commands.items()},
            "notes": [n.to_json() for n in self.notes],
        }


def quant_kind_of(ck: Checkpoint) -> str:
    kinds = engine_rules("common")["quant_kinds"]
    label = ck.declared.label
    if label:
        for kind in kinds:
            if label in kind["labels"] or label.split(":")[0] in kind["labels"]:
                return kind["id"]
    schemes = {}
    for g in ck.inventory.main_groups():
        if g.params and g.component in ("routed_expert", "mlp", "attention"):
            schemes[g.scheme] = schemes.get(g.scheme, 0) + g.bytes
    top = max(schemes, key=schemes.get) if schemes else "bf16"
    return next((k["id"] for k in kinds if top in k["schemes"]), "bf16")


def _verdicts(mtp: MtpAssessment | None) -> dict[str, Any]:
    if mtp is None:
        return {}
    return {e: {"verdict": v.verdict, "method": v.method, "draft_quantization": v.draft_quantization,
                "layers_used": v.layers_used} for e, v in mtp.verdicts.items()}


def _spec_on(mtp: MtpAssessment | None, engine: str) -> bool:
    v = mtp.verdicts.get(engine) if mtp else None
    return bool(v and v.verdict in SPEC_VERDICTS)


def _option(ck: Checkpoint, gpu: GpuSpec, facts: Facts, tp: int, ep: int, context: int, kv_dtype: str,
            target: int, mtp_layers: int) -> Option:
    mem = sglang_mem_fraction(gpu, tp, facts)
    wm = weight_memory(ck, tp, ep, with_mtp=facts.spec)
    gib = engine_rules("common")["planning"]["gib"]
    budget = int(gpu.memory_gib * gib * mem.value) - wm.total_bytes_per_rank
    per_token = kv_bytes_per_token(ck, tp, kv_dtype, extra_layers=mtp_layers if facts.spec else 0)
    kv = kv_capacity(budget, per_token, state_bytes_per_request(ck, tp), context, target, kv_dtype)
    return Option(wm, run_checks(ck, facts, tp, ep), mem, kv)


def _closeness(o: Option) -> tuple:
    # The option to explain when none works: fewest failed checks, then the smallest memory miss.
    return (o.loads, -sum(1 for c in o.checks if not c.ok), -o.kv.miss_bytes)


def _ep_order(moe: bool, tp: int, goal: str) -> tuple[int, ...]:
    if not moe or tp == 1:
        return (1,)
    # Throughput favours EP (fewer all-reduces on the expert path); latency keeps plain TP first.
    return (tp, 1) if goal == "throughput" else (1, tp)


def make_plan(checkpoint: Checkpoint, mtp: MtpAssessment | None, *, gpu: str, gpus: int, context: int | None = None,
              goal: str = "latency", engine: str = "both", probe_report: dict | None = None) -> Plan:
    if goal not in GOALS:
        raise PlanError(f"unknown goal {goal!r}; choose one of {', '.join(GOALS)}")
    if engine not in ENGINES:
        raise PlanError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}")
    spec_gpu = find_gpu(gpu)
    ck, cfg = checkpoint, checkpoint.config
    common = engine_rules("common")
    gib = common["planning"]["gib"]
    context = context or cfg.max_position_embeddings
    if not context:
        raise PlanError("config.json has no max_position_embeddings; pass --context TOKENS", path=ck.location)
    engines = ("sglang", "vllm") if engine == "both" else (engine,)
    lead = engines[0]
    moe = bool(cfg.routed_experts)
    facts = Facts(arch=spec_gpu.arch, quant=quant_kind_of(ck), attention=cfg.attention_kind, moe=moe,
                  interconnect=spec_gpu.interconnect, spec=_spec_on(mtp, lead), goal=goal,
                  model_type=cfg.model_type, name=ck.ref)
    sg_choices, sg_avoid = choose("sglang", facts)
    kv_choice = next((c.value for c in sg_choices if c.setting == "kv_cache_dtype"), None)
    kv_dtype = kv_choice or "auto"
    req = engine_rules("sglang")["requests"]
    target = req[goal]
    mtp_layers = mtp.verdicts[lead].layers_used if facts.spec else 0

    counts = sorted({*common["planning"]["gpu_counts"], gpus})
    options: list[Option] = []
    by_count: dict[int, list[Option]] = {}
    for n in counts:
        if n > max(gpus, max(common["planning"]["gpu_counts"])):
            continue
        by_count[n] = [_option(ck, spec_gpu, facts, n, ep, context, kv_dtype, target, mtp_layers)
                       for ep in _ep_order(moe, n, goal)]
        if n <= gpus:
            options.extend(by_count[n])

    def works(opts: list[Option]) -> Option | None:
        return next((o for o in opts if o.loads and o.fits), None)

    min_gpus, min_reason, previous = None, "", None
    for n in sorted(by_count):
        if works(by_count[n]):
            min_gpus = n
            if previous is not None:
                p = by_count[previous]
                best = max(p, key=_closeness)
                min_reason = f"{previous}x {spec_gpu.name}: {best.why_not(gib)}"
            break
        previous = n

    chosen = works(by_count[gpus])
    if chosen is None:
        opts = by_count[gpus]
        best = max(opts, key=_closeness)
        hint = (f"smallest that works: {min_gpus}x {spec_gpu.name}" if min_gpus
                else f"no count up to {max(by_count)}x {spec_gpu.name} works")
        raise PlanError(f"{ck.ref} does not run on {gpus}x {spec_gpu.name} at TP {gpus}: {best.why_not(gib)}", hint=hint)
    fixed = [c for c in by_count[gpus] if not c.loads and c.memory.ep != chosen.memory.ep]
    if chosen.memory.ep > 1 and fixed:
        reason = f"TP {gpus} with EP {chosen.memory.ep}: without EP {fixed[0].why_not(gib)}"
    elif chosen.memory.ep > 1:
        reason = f"TP {gpus} with EP {chosen.memory.ep} (goal {goal}: whole experts per rank)"
    else:
        reason = f"TP {gpus}: every divisibility check passes"

    running_reason = (f"goal {goal}: target {target} running requests"
                      + ("" if chosen.kv.max_running_requests == target else
                         f", lowered so the KV pool still holds one {context}-token request"))
    notes = [Note(n["severity"], n["message"], n["source"]) for n in common.get("notes", []) if facts.matches(n["when"])]
    if cfg.max_position_embeddings and context > cfg.max_position_embeddings:
        notes.append(Note("warning", f"--context {context} exceeds the model's max_position_embeddings "
                          f"{cfg.max_position_embeddings}: SGLang refuses it unless "
                          "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (quality beyond the trained length is not assured)",
                          "SG:configs/model_config.py (derived context_length check)"))
    speculative: dict[str, Any] = {}
    commands: dict[str, Command] = {}
    for name in engines:
        spec_on = _spec_on(mtp, name)
        efacts = Facts(**{**facts.__dict__, "spec": spec_on})
        choices, avoid = (sg_choices, sg_avoid) if name == "sglang" and spec_on == facts.spec else choose(name, efacts)
        spec_values, spec_reason = _spec_values(name, mtp, goal, probe_report) if spec_on else ({}, "")
        if name == "sglang" and spec_values.get("eagle_topk", 1) > 1:
            choices = _tree_draft_attention(choices, efacts)
        speculative[name] = spec_values or None
        if mtp and name in mtp.verdicts and not spec_on:
            notes.append(Note("info", f"{name}: no speculative flags, MTP verdict is {mtp.verdicts[name].verdict}",
                              "ckptinspect readiness (MtpAssessment)"))
        if spec_on and ((probe_report or {}).get("recommendation") or {}).get("enabled") is False:
            rec = probe_report["recommendation"]
            notes.append(Note(
                "warning", f"{name}: the probe projects that MTP does not pay off (x"
                f"{rec.get('projected_speedup_bs1', 0):.2f} at batch 1); the speculative flags below use its "
                "least costly setting; drop them to serve without MTP", "ckptinspect probe --format json"))
        if spec_on and mtp.verdicts[name].verdict == "degraded":
            notes.append(Note("warning", f"{name}: MTP verdict is degraded; expect lower acceptance "
                              f"({', '.join(mtp.verdicts[name].reasons)})", "ckptinspect readiness (MtpAssessment)"))
        mem_value, mem_reason, mem_source = _mem_flag(name, chosen.mem, efacts)
        inputs = LaunchInputs(
            model_path=ck.location if ck.kind == "local" else ck.ref, tp=chosen.memory.tp, ep=chosen.memory.ep,
            context=context, goal=goal, mem_fraction=mem_value, mem_fraction_reason=mem_reason,
            mem_fraction_source=mem_source, max_running_requests=chosen.kv.max_running_requests,
            running_reason=running_reason, running_source=engine_rules(name)["requests"]["source"],
            choices=choices, avoid=avoid, parsers=parsers_for(name, efacts), spec_enabled=spec_on,
            spec=spec_values, spec_reason=spec_reason, trust_remote_code=cfg.has_remote_code)
        commands[name] = sglang_command(inputs) if name == "sglang" else vllm_command(inputs, efacts)
    return Plan(ck.ref, spec_gpu, gpus, context, goal, engines, facts.quant, ck.declared.label, cfg.attention_kind,
                moe, chosen, reason, tuple(options), min_gpus, min_reason, mtp_dtypes(ck), _verdicts(mtp),
                speculative, commands, tuple(notes), gib)


def _tree_draft_attention(choices: tuple[Choice, ...], facts: Facts) -> tuple[Choice, ...]:
    """Swap the attention backend for one that supports --speculative-eagle-topk > 1."""
    from ckptinspect.plan.backends import arch_class

    rules = engine_rules("sglang")
    allowed = rules["speculative"]["topk_gt1_backends"]
    valid = rules["settings"]["attention_backend"]["valid"].get(arch_class("sglang", facts.arch), allowed)
    out = []
    for c in choices:
        if c.setting == "attention_backend" and c.value not in allowed:
            pick = next((b for b in allowed if b in valid), allowed[-1])
            c = Choice(c.setting, c.flag, pick, f"probe asks for eagle_topk > 1, which {c.value} cannot run",
                       rules["speculative"]["topk_source"])
        out.append(c)
    return tuple(out)


def _mem_flag(engine: str, mem: MemFraction, facts: Facts) -> tuple[float, str, str]:
    if engine == "sglang":
        why = f"SGLang's rule gives {mem.formula:g} (reserve {mem.reserved_mib / 1024:.1f} GiB for activations + graphs)"
        if mem.cap_reason:
            why += f"; capped: {mem.cap_reason}"
        return mem.value, why, mem.source
    rules = engine_rules("vllm")["memory"]
    cap = first_match(rules["caps"], facts)
    value = rules["default_utilization"]
    if cap and cap["max_fraction"] < value:
        return cap["max_fraction"], f"{cap['reason']}", cap["source"]
    return value, "vLLM default share of GPU memory for weights + KV", rules["source"]


def _spec_values(engine: str, mtp: MtpAssessment, goal: str, probe: dict | None) -> tuple[dict, str]:
    rules = engine_rules(engine)["speculative"]
    verdict = mtp.verdicts[engine]
    rec = ((probe or {}).get("recommendation") or {}).get(engine) or {}
    origin = "probe report" if rec else "engine defaults"
    why = f"MTP verdict {verdict.verdict}: draft with the checkpoint's {verdict.layers_used} MTP layer(s)"
    if engine == "sglang":
        algo = (verdict.method or rules["default_algorithm"]).upper()
        if algo not in rules["algorithms"]:
            algo = rules["default_algorithm"]
        d = rules["defaults"]
        values = {"algorithm": algo,
                  "num_steps": int(rec.get("num_steps", d["num_steps"])),
                  "eagle_topk": int(rec.get("eagle_topk", d["eagle_topk"])),
                  "num_draft_tokens": int(rec.get("num_draft_tokens", d["num_draft_tokens"])),
                  "from": origin, "source": "probe --report" if rec else rules["source"]}
        return values, f"{why} (NEXTN = EAGLE in SGLang)"
    k = int(rec.get("num_speculative_tokens", rules["num_speculative_tokens"][goal]))
    values = {"method": rules["method"], "num_speculative_tokens": k, "from": origin,
              "source": "probe --report" if rec else rules["source"]}
    return values, why
