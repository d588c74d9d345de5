"""make_plan: checkpoint + MTP verdicts + GPU -> TP/EP, memory, KV capacity and launch commands.

Order of decisions: the requested GPU count at the default settings; when a split there loads but
does not hold one full-context request, the max-context solver (plan/solver.py) finds the longest
context that does; when no split loads on all the GPUs (e.g. TP 3 against 32 heads), the largest
count below that loads is used and the rest stay idle, with the reason. Only when nothing runs is
the result a PlanFailure (`plan_or_failure`), which make_plan raises as a PlanError.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ckptinspect.errors import PlanError
from ckptinspect.plan.backends import choose
from ckptinspect.plan.command import EnvLine
from ckptinspect.plan.fit import component_quant
from ckptinspect.plan.gpus import GpuSpec, find_gpu, gpu_notes
from ckptinspect.plan.kvcache import kv_capacity
from ckptinspect.plan.launch import build_commands, probe_declines
from ckptinspect.plan.memory import Split, mtp_dtypes
from ckptinspect.plan.options import Option, closeness, ep_order, evaluate
from ckptinspect.plan.payoff import payoff_note, probe_gpu_mismatch
from ckptinspect.plan.result import Note, Plan, PlanFailure
from ckptinspect.plan.rules import PlanFacts, engine_rule_file, engine_rules, holds
from ckptinspect.plan.solver import ContextSolution, solve_max_context
from ckptinspect.readiness.engine_archs import arch_support
from ckptinspect.records import Checkpoint, MtpAssessment

GOALS = ("latency", "throughput")
ENGINES = ("sglang", "vllm", "both")
SPEC_VERDICTS = ("ready", "degraded")


def quant_kind_of(ck: Checkpoint) -> str:
    kinds = engine_rules("common")["quant_kinds"]
    label = ck.declared.label
    if label:
        for kind in kinds:
            if label in kind["labels"] or label.split(":")[0] in kind["labels"]:
                return kind["id"]
    return component_quant(ck, ("routed_expert", "mlp", "attention"), "bf16")


def spec_on(mtp: MtpAssessment | None, engine: str) -> bool:
    v = mtp.verdicts.get(engine) if mtp else None
    return bool(v and v.verdict in SPEC_VERDICTS)


def _verdicts(mtp: MtpAssessment | None) -> dict[str, Any]:
    if mtp is None:
        return {}
    return {e: {"verdict": v.verdict, "method": v.method, "draft_quantization": v.draft_quantization,
                "layers_used": v.layers_used} for e, v in mtp.verdicts.items()}


def make_plan(checkpoint: Checkpoint, mtp: MtpAssessment | None, *, gpu: str | GpuSpec, gpus: int, context: int | None = None,
              goal: str = "latency", engine: str = "both", probe_report: dict | None = None,
              max_context: bool = False, concurrency: int = 1) -> Plan:
    """The plan, or PlanError saying why nothing runs (with the numbers)."""
    result = plan_or_failure(checkpoint, mtp, gpu=gpu, gpus=gpus, context=context, goal=goal, engine=engine,
                             probe_report=probe_report, max_context=max_context, concurrency=concurrency)
    if isinstance(result, PlanFailure):
        raise PlanError(result.message, hint=result.hint)
    return result


def plan_or_failure(checkpoint: Checkpoint, mtp: MtpAssessment | None, *, gpu: str | GpuSpec, gpus: int,
                    context: int | None = None, goal: str = "latency", engine: str = "both",
                    probe_report: dict | None = None, max_context: bool = False,
                    concurrency: int = 1) -> Plan | PlanFailure:
    """Like make_plan, but a plan that cannot be made is a PlanFailure record (bad input still raises)."""
    if goal not in GOALS:
        raise PlanError(f"unknown goal {goal!r}; choose one of {', '.join(GOALS)}")
    if engine not in ENGINES:
        raise PlanError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}")
    if concurrency < 1:
        raise PlanError(f"--concurrency must be at least 1, got {concurrency}")
    spec_gpu = find_gpu(gpu)
    ck, cfg = checkpoint, checkpoint.config
    common = engine_rules("common")
    gib = common["planning"]["gib"]
    unreadable = _no_weights(ck)
    if unreadable:
        # Sizing 0 bytes of weights would print a command for a model that cannot be served.
        return PlanFailure(ck.ref, spec_gpu, gpus, context or cfg.max_position_embeddings or 0, unreadable,
                           "convert the weights to safetensors (engines and this tool read only those)",
                           (), None, gib)
    requested = context or cfg.max_position_embeddings
    if not requested:
        raise PlanError("config.json has no max_position_embeddings; pass --context TOKENS", path=ck.location)
    engines = ("sglang", "vllm") if engine == "both" else (engine,)
    refused = [a for a in (arch_support(e, engine_rules(e)["version"], cfg) for e in engines)
               if a is not None and a.status == "refused"]
    if len(refused) == len(engines):
        # No engine asked for has a model class for the target: no command, the reason instead.
        others = [e for e in ("sglang", "vllm") if e not in engines]
        return PlanFailure(ck.ref, spec_gpu, gpus, requested or 0, "; ".join(a.message for a in refused),
                           (f"try --engine {others[0]}" if others else
                            "serve it with an engine version that registers " + refused[0].architecture),
                           (), None, gib)
    lead = next(e for e in engines if e not in {a.engine for a in refused})
    moe = bool(cfg.routed_experts)
    facts = PlanFacts(arch=spec_gpu.arch, quant=quant_kind_of(ck), attention=cfg.attention_kind, moe=moe,
                  interconnect=spec_gpu.interconnect,
                  spec=spec_on(mtp, lead) and not probe_declines(probe_report), goal=goal, model_type=cfg.model_type)
    sg_choices, _ = choose("sglang", facts)
    kv_dtype = next((c.value for c in sg_choices if c.setting == "kv_cache_dtype"), None) or "auto"
    attention_backend = next((c.value for c in sg_choices if c.setting == "attention_backend"), None)
    target = engine_rules("sglang")["requests"][goal]
    mtp_layers = mtp.verdicts[lead].layers_used if facts.spec else 0

    limit = max(gpus, max(common["planning"]["gpu_counts"]))
    counts = sorted(n for n in {*common["planning"]["gpu_counts"], gpus} if n <= limit)
    by_count = {n: [evaluate(ck, spec_gpu, facts, n, ep, requested, kv_dtype, target, mtp_layers)
                    for ep in ep_order(moe, n, goal)] for n in counts}
    options = tuple(o for n in counts if n <= gpus for o in by_count[n])

    def works(n: int) -> Option | None:
        return next((o for o in by_count[n] if o.loads and o.fits), None)

    min_gpus = next((n for n in counts if works(n)), None)
    below = [n for n in counts if min_gpus is not None and n < min_gpus]
    min_reason = (f"{below[-1]}x {spec_gpu.name}: {max(by_count[below[-1]], key=closeness).why_not(gib)}"
                  if below else "")

    def solve(o: Option) -> ContextSolution:
        return solve_max_context(ck, spec_gpu, facts, Split.sglang(o.memory.tp, o.memory.ep), kv_dtype=kv_dtype,
                                 attention_backend=attention_backend, mtp_layers=mtp_layers,
                                 concurrency=concurrency, requested=requested)

    # The largest count <= gpus where some split loads; the GPUs above it stay idle.
    usable = [n for n in counts if n <= gpus and any(o.loads for o in by_count[n])]
    if not usable:
        best = max(by_count[gpus], key=closeness)
        hint = _failure_hint(min_gpus, by_count, spec_gpu, gib)
        return PlanFailure(ck.ref, spec_gpu, gpus, requested, f"at TP {gpus}: {best.why_not(gib)}", hint,
                           options, None, gib)
    used = usable[-1]
    chosen = works(used)
    solution = None
    if chosen is None or max_context:
        loading = [o for o in by_count[used] if o.loads]
        base = chosen or max(loading, key=closeness)
        solution = solve(base)
        if solution.chosen is None:
            hint = _failure_hint(min_gpus, by_count, spec_gpu, gib)
            return PlanFailure(ck.ref, spec_gpu, gpus, requested, _nothing_fits(solution, base, gib), hint,
                               options, solution, gib)
        chosen = _solved_option(base, solution)
    context = solution.chosen.max_context if solution else requested

    idle_reason = ""
    if used < gpus:
        failing = max(by_count[gpus], key=closeness)
        idle_reason = (f"{gpus - used} of {gpus} GPUs stay idle: TP {gpus} fails ({failing.why_not(gib)}); "
                       f"TP {used} is the largest size that loads")
    reason = _parallel_reason(by_count[used], chosen, used, goal, gib)
    running_target = concurrency if solution else target
    running_reason = (f"{concurrency} concurrent request(s) at the solved context" if solution else
                      f"goal {goal}: target {target} running requests"
                      + ("" if chosen.kv.max_running_requests == target else
                         f", lowered so the KV pool still holds one {context}-token request"))
    notes = [Note(n["severity"], n["message"], n["source"]) for n in common.get("notes", []) if holds(n["when"], facts, source=engine_rule_file("common"))]
    notes += [Note("info", text, "ckptinspect plan: --gpu-memory / --gpu-spec") for text in gpu_notes(spec_gpu)]
    # The engine only logs or pads at these checks: the plan runs and says what the engine will say.
    notes += [Note("warning", f"TP {chosen.memory.tp} EP {chosen.memory.ep}: {c.message}", c.source)
              for c in chosen.checks if c.warns]
    if idle_reason:
        notes.append(Note("warning", idle_reason, "ckptinspect plan: divisibility checks (rules/engines/common.yaml)"))
        replicas = next((n for n in counts if n < gpus and gpus % n == 0 and works(n)), None)
        if replicas:
            k = gpus // replicas
            notes.append(Note("info", f"all {gpus} GPUs can serve as {k} data-parallel replicas of TP {replicas}: "
                              f"--dp-size {k} --tp-size {replicas} (SGLang) / --data-parallel-size {k} "
                              f"--tensor-parallel-size {replicas} (vLLM); each replica holds the whole model",
                              "SG:arg_groups/fields/parallel.py dp_size; VL:engine/arg_utils.py EngineArgs.data_parallel_size"))
    if solution and solution.chosen.id != "defaults":
        notes.append(Note("warning", f"context reduced to {context} tokens for {concurrency} concurrent request(s) "
                          f"(requested {requested}); risk: {solution.chosen.risk}", solution.chosen.source))
    beyond = bool(cfg.max_position_embeddings and context > cfg.max_position_embeddings)
    if beyond:
        notes.append(Note("warning", f"--context {context} exceeds the model's max_position_embeddings "
                          f"{cfg.max_position_embeddings}: the commands set the variable each engine requires "
                          "to start with it (quality beyond the trained length is not assured)",
                          "SG:configs/model_config.py:1291-1316 ModelConfig._derive_context_length (ValueError unless the variable is set); VL:config/model.py _get_and_verify_max_len"))
    speculative, commands, more_notes = build_commands(
        ck, mtp, facts, engines, chosen, context=context, goal=goal, probe_report=probe_report,
        running=chosen.kv.max_running_requests if not solution else running_target, running_reason=running_reason,
        solution=solution)
    if beyond:
        commands = {name: replace(cmd, env=(*cmd.env, _longer_context_env(name, context, cfg.max_position_embeddings)))
                    for name, cmd in commands.items()}
    notes.extend(more_notes)
    notes.extend(_shared_card_note(spec_gpu, commands))
    if any(speculative.values()):
        mismatch = probe_gpu_mismatch(probe_report, spec_gpu) if probe_report else ""
        if mismatch:
            notes.append(Note("warning", mismatch, "ckptinspect probe --format json (cost_model.gpu)"))
        elif not probe_report:
            notes.append(Note("info", payoff_note(ck, spec_gpu), "ckptinspect plan/payoff.py; docs/probe.md"))
    return Plan(ck.ref, spec_gpu, gpus, context, goal, engines, facts.quant, ck.declared.label, cfg.attention_kind,
                moe, chosen, reason, options, min_gpus, min_reason, mtp_dtypes(ck), _verdicts(mtp),
                speculative, commands, tuple(notes), gib, requested, used, idle_reason, solution)


# Each engine refuses a context above the model's derived maximum unless this variable is set: SGLang
# 0.5.23's _derive_context_length raises "To allow overriding this maximum, set the env var
# SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1", vLLM's _get_and_verify_max_len the same with
# VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (the sources below).
LONGER_CONTEXT_ENV = {"sglang": ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SG:configs/model_config.py _derive_context_length"),
                      "vllm": ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VL:config/model.py _get_and_verify_max_len")}


def _longer_context_env(engine: str, context: int, trained: int) -> EnvLine:
    name, source = LONGER_CONTEXT_ENV[engine]
    return EnvLine(name, "1", f"--context {context:,} is above the model's {trained:,}; without it the engine "
                   "refuses to start", source)


def _failure_hint(min_gpus: int | None, by_count: dict[int, list[Option]], gpu: GpuSpec, gib: int) -> str:
    """What would run, on the card the user asked about: more of it, a shorter context, a smaller quant
    or weight offload; never another card (issue 26 item 7)."""
    if min_gpus:
        return f"smallest that works: {min_gpus}x {gpu.name} (--gpus {min_gpus})"
    most = max(by_count)
    loads = [n for n in by_count if any(o.loads for o in by_count[n])]
    if not loads:
        return (f"no TP / EP size up to {most}x {gpu.name} passes the engines' divisibility checks for this "
                f"model")
    best = max((o for o in by_count[loads[-1]] if o.loads), key=closeness)
    pool = gpu.memory_gib * gib * best.mem.value
    if best.memory.total_bytes_per_rank < pool:  # the weights load: the KV cache of one request is what misses
        return (f"no count up to {most}x {gpu.name} holds one request of this context: a shorter --context "
                f"(or --max-context to solve for the longest that fits)")
    return (f"no count up to {most}x {gpu.name} holds the weights: a smaller quant of the model, or weight "
            f"offload to CPU memory (SGLang / vLLM --cpu-offload-gb; slower, not planned here)")


def _shared_card_note(gpu: GpuSpec, commands: dict) -> list[Note]:
    """--gpu-memory on a whole card shared with other jobs (not a MIG slice): vLLM takes
    --gpu-memory-utilization of the card's total memory and refuses to start when less is free; SGLang
    0.5.23 takes --mem-fraction-static of the memory free before the model loads, so its value stands."""
    vllm = commands.get("vllm")
    if gpu.catalog_memory_gib is None or vllm is None:
        return []
    util = next((float(f.value) for f in vllm.flags if f.flag == "--gpu-memory-utilization" and f.value), None)
    if util is None:
        return []
    shared = util * gpu.memory_gib / gpu.catalog_memory_gib
    return [Note("warning", f"vllm: if the {gpu.memory_gib:g} GiB are the free part of a whole "
                 f"{gpu.catalog_memory_gib:g} GiB card shared with other jobs (not a MIG slice), pass "
                 f"--gpu-memory-utilization {shared:.3f} instead (a fraction of the whole card); SGLang's "
                 f"--mem-fraction-static is a fraction of the memory free at start and stands",
                 "VL:v1/worker/utils.py request_memory (total_memory x gpu_memory_utilization); "
                 "SG:mem_cache/kv_cache_configurator.py _profile_available_bytes (pre_model_load_memory)")]


def _no_weights(ck: Checkpoint) -> str:
    """Why no plan can be sized ("" when weights were read): the report's no-weights error, or no tensor."""
    for f in ck.findings:
        if f.code == "no-weights":
            return f"no readable weights: {f.message}"
    if ck.inventory.totals.tensors == 0:
        return "no readable weights: the checkpoint's safetensors files hold no tensors"
    return ""


def _solved_option(base: Option, solution: ContextSolution) -> Option:
    s = solution.chosen
    kv = kv_capacity(s.budget_bytes, s.cost, s.max_context, solution.concurrency, s.kv_dtype)
    return Option(s.weights, base.checks, s.mem, kv)


def _nothing_fits(solution: ContextSolution, base: Option, gib: int) -> str:
    applied = [s for s in solution.steps if not s.skipped]
    best = max(applied, key=lambda s: s.budget_bytes)
    pool = best.budget_bytes + best.weights.total_bytes_per_rank
    return (f"at TP {base.memory.tp} EP {base.memory.ep} the weights take "
            f"{best.weights.total_bytes_per_rank / gib:.1f} GiB per GPU and the largest static pool the rules allow "
            f"({best.mem.value:g} x GPU memory, step {best.id}) is {pool / gib:.1f} GiB: "
            f"needs {solution.shortfall_bytes / gib:.1f} GiB more per GPU for {solution.concurrency} request(s) of "
            f"{solution.min_context} tokens")


def _parallel_reason(opts: list[Option], chosen: Option, tp: int, goal: str, gib: int) -> str:
    fixed = [c for c in opts if not c.loads and c.memory.ep != chosen.memory.ep]
    if chosen.memory.ep > 1 and fixed:
        return f"TP {tp} with EP {chosen.memory.ep}: without EP {fixed[0].why_not(gib)}"
    if chosen.memory.ep > 1:
        return f"TP {tp} with EP {chosen.memory.ep} (goal {goal}: whole experts per rank)"
    return f"TP {tp}: every divisibility check passes"


__all__ = ["GOALS", "ENGINES", "GpuSpec", "Plan", "PlanFailure", "make_plan", "plan_or_failure", "quant_kind_of"]
