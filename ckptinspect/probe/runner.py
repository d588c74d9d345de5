"""``run_probe``: open the checkpoint through the report pipeline, load main model + MTP head,
build sequences, score them, project the cost."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Callable, Sequence as Seq

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.settings import Settings
from ckptinspect.probe import loader
from ckptinspect.probe.checkpoint import ProbeCheckpoint, open_checkpoint
from ckptinspect.probe.heads import HeadSpec, spec_from_rule
from ckptinspect.probe.heads.build import build_head
from ckptinspect.probe.options import DEFAULT_GENERATE, MODES, ProbeOptions
from ckptinspect.probe.prompts import encode_prompt, load_prompts, load_tokenizer
from ckptinspect.probe.readiness_gate import check_mtp_usable
from ckptinspect.probe.result import ProbeResult, build_result
from ckptinspect.probe.scoring import (ATTENTION_MIN_BLOCK, AUTO_FRACTION, LOGITS_TOKENS, SLACK_BYTES, decode_bytes,
                                       estimate_bytes, forward_bytes_per_token, generation_bytes, plan_batches,
                                       attention_dims, score_all, scoring_bytes, weight_bytes)
from ckptinspect.probe.streamed_run import attention_counts
from ckptinspect.probe.sequences import generate_sequences, save_continuations, teacher_sequences

__all__ = ["MODES", "ProbeOptions", "build_head", "estimate_bytes", "run_probe"]


def _device_plan(device: str, devices: Seq[int] | None) -> tuple[Any, list[str], str]:
    """(device_map, device names, primary device)."""
    if devices:
        if not torch.cuda.is_available():
            raise ProbeError("--devices needs CUDA, and torch sees no GPU")
        names = [f"cuda:{d}" for d in devices]
        if len(names) == 1:
            return {"": names[0]}, names, names[0]
        return "auto", names, names[0]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ProbeError(f"--device {device} requested, but torch sees no GPU (use --device cpu)")
    return {"": device}, [device], device


def _free_bytes(names: list[str], override: int | None = None) -> int:
    """Free memory on ``names`` (``override``: Settings.probe_memory_limit, bytes; lets tests exercise the check)."""
    if override is not None:
        return override
    if names[0].startswith("cuda"):
        return sum(torch.cuda.mem_get_info(torch.device(n))[0] for n in names)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # non-Linux: no reliable figure, do not block
        return 1 << 62


def _spec(probe_ckpt: ProbeCheckpoint) -> HeadSpec | None:
    block = probe_ckpt.probe_rule
    return None if block is None else spec_from_rule(probe_ckpt.family_rule.id, block)


def _check_code(config: dict, spec: HeadSpec | None, trust_remote_code: bool, model_dir: str) -> None:
    from transformers import CONFIG_MAPPING

    model_type = str(config.get("model_type"))
    if (spec and spec.main_model_type) or trust_remote_code or model_type in CONFIG_MAPPING:
        return
    if config.get("auto_map"):
        raise ProbeError("the checkpoint needs remote code (config.json auto_map, model_type "
                         f"{model_type!r} unknown to transformers); pass --trust-remote-code to run it", path=model_dir)
    import transformers

    raise ProbeError(f"transformers {transformers.__version__} has no model for model_type {model_type!r}",
                     path=model_dir)


def run_probe(model: str, options: ProbeOptions | None = None, *, settings: "Settings | None" = None,
              head_factory: Callable | None = None, **overrides: Any) -> ProbeResult:
    """Measure draft acceptance of ``model``'s MTP head in process; see docs/probe.md. ``options``
    (ckptinspect/probe/options.py: what each one means, and the checks made when they are built) with
    ``overrides`` applied (``dataclasses.replace``: ``run_probe(model, steps=2)``; an unknown name is a
    TypeError). ``settings``: the bounded network client's limits for ``main_url``; the settings-derived
    defaults (memory limits, ``generate``) are api.probe's to fill in. ``head_factory(spec, main, load_dir)``
    builds the MTP head instead of ``build_head`` (tests)."""
    o = options if options is not None else ProbeOptions()
    if overrides:
        o = replace(o, **overrides)
    if o.engine:
        raise ProbeError("run_probe measures in process: options with engine= go to api.probe "
                         "(engine_client.run_engine)")
    steps, temperature, batch_size = o.draft_steps, o.sampling_temperature, o.batch_size
    started = time.time()
    timings: dict[str, float] = {}
    from ckptinspect.probe.cost import DEFAULT_EFFICIENCY, load_efficiency

    efficiency = load_efficiency(o.cost_calibration) if o.cost_calibration else DEFAULT_EFFICIENCY
    model_dir = loader.resolve_model_dir(model)
    if o.save_continuations_to:  # refused before the run, not after it (no command writes into a model dir)
        from ckptinspect.snapshot_output import refuse_output_in_model_dir

        refuse_output_in_model_dir(model_dir, o.save_continuations_to, "the --save-continuations file")
    probe_ckpt = open_checkpoint(model_dir)
    config = dict(probe_ckpt.checkpoint.config.raw)
    vocab = probe_ckpt.checkpoint.config.vocab_size
    spec = _spec(probe_ckpt)
    _check_code(config, spec, o.trust_remote_code, model_dir)
    readiness = check_mtp_usable(probe_ckpt, spec, model_dir)
    metas = probe_ckpt.metas
    device_map, names, primary = _device_plan(o.device, o.devices)
    torch_dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                   "fp32": torch.float32, "float32": torch.float32}.get(o.dtype or "", None)
    if torch_dtype is None:
        torch_dtype = torch.bfloat16 if primary.startswith("cuda") else torch.float32
    synthetic = bool(o.categories) and "synthetic" in o.categories
    real = [c for c in o.categories or () if c != "synthetic"]
    prompt_list = ([] if synthetic and not real else
                   select_categories(load_prompts(o.prompts), real or None, o.prompts or "the built-in prompt set"))
    if o.max_prompts:
        prompt_list = prompt_list[:o.max_prompts]
    common = dict(ref=model, probe_ckpt=probe_ckpt, spec=spec, steps=steps, temperature=temperature, gpu=o.gpu,
                  readiness=readiness, started=started, max_new_tokens=o.max_new_tokens, efficiency=efficiency)
    if o.main_url:  # the main model lives in the server: no in-process memory check
        if synthetic:
            raise ProbeError("the synthetic category needs the in-process main model (not --main-url)")
        if o.mode != "greedy":
            raise ProbeError("--main-url supports --mode greedy only")
        if o.experts_implementation != "auto":
            raise ProbeError("--experts-implementation chooses in-process kernels; with --main-url the server runs "
                             "the main model")
        from ckptinspect.probe.server_client import run_remote

        return run_remote(o.main_url, model_dir=model_dir, config=config, probe_ckpt=probe_ckpt, spec=spec,
                          prompts=prompt_list, steps=steps, max_new_tokens=o.max_new_tokens, gpu=o.gpu,
                          readiness=readiness, device=primary, dtype=torch_dtype, started=started, ref=model,
                          batch_size=batch_size, progress=o.progress, temperature=temperature, efficiency=efficiency,
                          settings=settings)
    tok = load_tokenizer(model_dir, vocab, trust_remote_code=o.trust_remote_code)
    if synthetic:
        from ckptinspect.probe.synthetic import synthetic_prompts

        prompt_list = prompt_list + synthetic_prompts(min(vocab or len(tok), len(tok)), tok.all_special_ids,
                                                      length=o.synthetic_len)
    longest_prompt = 0
    if o.mode == "greedy":
        encoded = [encode_prompt(tok, p, chat=True, vocab_size=vocab, source=model_dir) for p in prompt_list]
        lengths = [len(e) + o.max_new_tokens for e in encoded]
        longest_prompt = max(len(e) for e in encoded)
    else:
        sequences = teacher_sequences(tok, prompt_list, o.corpus, o.continuations,
                                      vocab, model_dir)
        if synthetic and (o.corpus or o.continuations):  # the synthetic prompts scored beside the corpus
            sequences += teacher_sequences(tok, [p for p in prompt_list if p.ids is not None], None, None, vocab,
                                           model_dir)
        lengths = [len(s.tokens) for s in sequences]
    longest, count = max(lengths), len(lengths)
    cfg = probe_ckpt.checkpoint.config
    limit = int(o.max_gpu_memory * 2**30) if o.max_gpu_memory is not None else _free_bytes(names, o.memory_limit)
    expert_params = _params_per_expert(probe_ckpt)
    fwd = forward_bytes_per_token(cfg, torch_dtype)
    fixed = weight_bytes(metas, torch_dtype) + SLACK_BYTES
    budget = int(limit * AUTO_BATCH_FRACTION) - fixed  # scoring scratch of one batch

    def scratch_at(rows: int, width: int, block: int | None, logits_tokens: int = LOGITS_TOKENS) -> int:
        return scoring_bytes(rows, width, vocab or 0, cfg.hidden_size, steps, torch_dtype,
                             cfg.num_attention_heads or 0, block, fwd, logits_tokens, head_dims=attention_dims(cfg))

    def decode_at(batch: int) -> int:
        return (decode_bytes(min(batch, count), cfg.experts_per_token or 0, expert_params, torch_dtype)
                if o.mode == "greedy" and primary.startswith("cuda") else 0)

    def need_at(batch: int) -> int:  # the widest batch of this many rows: dense attention if it fits, else blocked
        b = min(batch, count)
        if o.mode == "greedy":
            # Generation runs the whole batch at once; the scoring after it is planned in sub-batches
            # (plan_batches) that fit the same budget, so only generation and one row's scoring bound it.
            return fixed + max(generation_bytes(b, longest_prompt, longest, cfg, torch_dtype, fwd, vocab or 0,
                                                decode_at(b)), least_scoring)
        dense = scratch_at(b, longest, None)
        scratch = dense if dense <= budget else min(dense, scratch_at(b, longest, ATTENTION_MIN_BLOCK))
        return fixed + max(scratch, decode_at(b))

    least_scoring = min(scratch_at(1, longest, None, LOGITS_TOKENS >> 7),
                        scratch_at(1, longest, ATTENTION_MIN_BLOCK, LOGITS_TOKENS >> 7))
    batch_source = "given"
    if batch_size is None:
        if o.mode == "greedy":
            batch_size, batch_source = auto_batch(need_at, count, limit)
        else:
            batch_size, batch_source = count, (f"auto: each batch as many sequences as fit {AUTO_BATCH_FRACTION:.0%} "
                                               f"of {limit / 2**30:.1f} GiB by the memory estimate, at most "
                                               f"{TEACHER_BATCH_TOKENS} padded tokens")
    smallest = LOGITS_TOKENS >> 7  # plan_batches' smallest logits chunk
    in_memory_need = fixed + min(scratch_at(1, longest, None, smallest),
                                 scratch_at(1, longest, ATTENTION_MIN_BLOCK, smallest))
    if o.mode == "greedy" and need_at(batch_size) > limit or o.mode == "teacher" and in_memory_need - fixed > budget:
        if o.mode != "teacher" or len(names) > 1:
            need = need_at(batch_size) if o.mode == "greedy" else in_memory_need
            raise ProbeError(f"needs about {need / 2**30:.1f} GiB ({loader.logical_params(metas) / 1e9:.2f} B "
                             f"params at {str(torch_dtype).replace('torch.', '')} + scoring scratch) but only "
                             f"{limit / 2**30:.1f} GiB is {'allowed' if o.max_gpu_memory is not None else 'free'} on "
                             f"{', '.join(names)}; --mode teacher streams the layers of a model that does not fit, "
                             "or use --main-url", path=model_dir)
        from ckptinspect.probe.streamed_run import run_streamed

        return run_streamed(model_dir, probe_ckpt, spec, sequences, tok, common=common, mode=o.mode, device=primary,
                            dtype=torch_dtype, max_rows=batch_size, progress=o.progress, need=in_memory_need,
                            limit=limit, chunk_tokens=o.stream_chunk_tokens, timings=timings,
                            trust_remote_code=o.trust_remote_code, experts_implementation=o.experts_implementation,
                            batch_info={"batch_size_source": batch_source}, store=o.stream_store,
                            host_limit=o.host_memory_limit)
    if o.mode == "teacher":
        batches = plan_batches(lengths, batch_size, budget, scratch_at, heads=cfg.num_attention_heads or 1,
                               source=model_dir, max_tokens=TEACHER_BATCH_TOKENS if batch_source != "given" else None)
        need = fixed + max(scratch_at(len(b.indices), b.width, b.attention_block, b.logits_tokens) for b in batches)
    else:
        need = need_at(batch_size)

    t0 = time.perf_counter()
    load_dir, tmp = loader.prepare_loadable_dir(model_dir, metas, torch_dtype if torch_dtype != torch.float32 else torch.bfloat16, o.progress)
    try:
        main = loader.load_main_model(load_dir, config, main_model_type=spec.main_model_type, device_map=device_map,
                                      dtype=torch_dtype, trust_remote_code=o.trust_remote_code)
        # before the head is built: a fusion head copies the main config, experts implementation included
        experts = loader.set_experts_implementation(main, o.experts_implementation,
                                                    decode_on_gpu=primary.startswith("cuda") and o.mode == "greedy")
        head = (head_factory(spec, main, load_dir) if head_factory else
                build_head(spec, main, load_dir, model_dir, None if spec.kind == "transformers" else metas))
    finally:
        if tmp is not None:
            tmp.cleanup()
    first_device = next(main.parameters()).device
    timings["load"] = time.perf_counter() - t0
    peaks: dict[str, int] | None = {} if first_device.type == "cuda" else None  # bytes per phase
    if peaks is not None:
        peaks["load"] = torch.cuda.max_memory_allocated(first_device)
        torch.cuda.reset_peak_memory_stats(first_device)
    if o.mode == "greedy":
        t0 = time.perf_counter()
        generation: dict = {}
        sequences = generate_sequences(main, tok, prompt_list, o.max_new_tokens, batch_size, first_device,
                                       o.progress, vocab_size=vocab, source=model_dir,
                                       generate=o.generate or DEFAULT_GENERATE, info=generation)
        timings["generate"] = time.perf_counter() - t0
        if peaks is not None:
            peaks["generate"] = torch.cuda.max_memory_allocated(first_device)
        if o.save_continuations_to:
            save_continuations(o.save_continuations_to, sequences, model_dir=model_dir,
                               max_new_tokens=o.max_new_tokens)
        if first_device.type == "cuda":  # generation's KV cache and transients go back before scoring
            torch.cuda.empty_cache()
        # scoring in sub-batches that fit the budget; a given batch that passed the memory check fits too
        batches = plan_batches([len(q.tokens) for q in sequences], batch_size,
                               max(budget, need_at(batch_size) - fixed - decode_at(batch_size)),
                               scratch_at, heads=cfg.num_attention_heads or 1, source=model_dir)
    kernels: set[str] = set()
    tallies = score_all(main, head, sequences, steps, mode=o.mode, temperature=temperature, batches=batches,
                        pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0, device=first_device,
                        progress=o.progress, timings=timings, peaks=peaks, kernels=kernels)
    return build_result(**common, mode=o.mode, tallies=tallies, devices=names,
                        dtype=str(torch_dtype).replace("torch.", ""), main_source="in-process transformers",
                        dequantized=tmp is not None, timings=timings,
                        extra={"tokens_scored": sum(len(s.tokens) for s in sequences), "memory_estimate_bytes": need,
                               "scoring_estimate_bytes": fixed + max(scratch_at(len(b.indices), b.width, b.attention_block,
                                                                                b.logits_tokens) for b in batches),
                               "batch_size": max(len(b.indices) for b in batches) if o.mode == "teacher" else batch_size,
                               "batch_size_source": batch_source, "attention": attention_counts(batches, kernels),
                               "experts_implementation": experts,
                               **({"generate": generation} if o.mode == "greedy" else {}),
                               **({"peak_bytes_by_phase": peaks} if peaks is not None else {})})


def _params_per_expert(probe_ckpt) -> int:
    """One routed expert's weight elements (main model), from the report's inventory: all routed
    expert params / (experts per layer x layers holding them); 0 for a dense model."""
    from ckptinspect.probe.result import model_cost

    cost = model_cost(probe_ckpt.inventory, probe_ckpt.checkpoint.config)
    layers = len({g.layer for g in probe_ckpt.inventory.groups
                  if g.component == "routed_expert" and g.mtp_layer is None and g.layer is not None})
    return cost.expert_params // (cost.num_experts * layers) if cost.num_experts and layers else 0


AUTO_BATCH_FRACTION = AUTO_FRACTION
# Teacher mode's default batches stop here: on an H200 (BENCHMARKS.md section 11) 16k-67k-token batches
# ran within timing noise of each other, and a 300k-token batch's MoE forward allocated past the
# per-token estimate (37 GiB in one grouped_mm call) and failed.
TEACHER_BATCH_TOKENS = 32768


def auto_batch(need_at: Callable[[int], int], count: int, limit: int) -> tuple[int, str]:
    """The largest batch (<= the number of sequences) whose estimate fits AUTO_BATCH_FRACTION of
    ``limit``; 1 when none does (the caller's memory check then reports it). The estimate grows
    with the batch, so a bisection finds it."""
    budget = int(limit * AUTO_BATCH_FRACTION)
    lo, hi = 1, max(count, 1)
    if need_at(hi) <= budget:
        lo = hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need_at(mid) <= budget else (lo, mid - 1)
    return lo, f"auto: largest batch whose estimate fits {AUTO_BATCH_FRACTION:.0%} of {limit / 2**30:.1f} GiB"


def select_categories(prompts: list, categories: Seq[str] | None, source: str) -> list:
    """The prompts of the named categories (all when None); an unknown category is an error."""
    if not categories:
        return prompts
    known = sorted({p.category for p in prompts})
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise ProbeError(f"no prompts of category {', '.join(unknown)} in {source} (categories: {', '.join(known)})")
    return [p for p in prompts if p.category in set(categories)]


