"""Teacher mode over a layer-streamed main model (``stream.py``): the corpus in chunks through one
layer at a time, its residual stream waiting on the device or in pinned host memory, and the corpus
taken in rounds (each a pass over the layers) when even the host cannot hold it; then the MTP chain
and the walk per batch on the stored hidden states."""

from __future__ import annotations

import os
import time

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader
from ckptinspect.probe.evaluate import Sequence
from ckptinspect.probe.metrics import Tally

STORES = ("auto", "device", "host")
HOST_FRACTION = 0.5  # of the machine's physical memory the store may take (pinned pages are not swappable)


def hf_config(model_dir: str, config: dict, spec, trust_remote_code: bool):
    from transformers import AutoConfig, CONFIG_MAPPING

    if spec.main_model_type:  # same rule as loader.load_main_model: a built-in class, no remote code
        return CONFIG_MAPPING[spec.main_model_type](**{k: v for k, v in config.items()
                                                       if k not in ("auto_map", "architectures", "model_type")})
    return AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def host_budget(override: int | None = None) -> int:
    """Host bytes for the hidden states (``override``: Settings.probe_host_memory_limit; lets tests force rounds)."""
    if override is not None:
        return override
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * HOST_FRACTION)
    except (ValueError, OSError):
        return 1 << 62


def plan_store(estimate_at, tokens: int, row_bytes: int, limit: int, store: str, host: int) -> tuple[str, int]:
    """(store, rounds). ``estimate_at(store_tokens)`` is the streamed device estimate with that many
    tokens' residual stream on the device. The device store needs no copies, so it is taken when the
    whole corpus fits beside the layer; else the host store (a copy in and out per chunk and layer,
    ~2 x tokens x hidden bytes over PCIe per layer against seconds of weight reading; BENCHMARKS.md
    section 11 measures both); rounds only when the host cannot hold the corpus's stream either (each
    round reads every layer again)."""
    if store == "device" or (store == "auto" and estimate_at(tokens) <= limit):
        return "device", 1
    return "host", max(1, -(-tokens * row_bytes // max(host, 1)))


def run_streamed(model_dir: str, probe_ckpt, spec, sequences: list[Sequence], tok, *, common: dict, mode: str,
                 device: str, dtype: torch.dtype, max_rows: int, progress: bool, need: int, limit: int,
                 chunk_tokens: int, timings: dict[str, float], trust_remote_code: bool = False,
                 experts_implementation: str = "auto", batch_info: dict | None = None, store: str = "auto",
                 host_limit: int | None = None):
    from ckptinspect.probe.result import Streaming, build_result
    from ckptinspect.probe.heads.build import build_head
    from ckptinspect.probe.scoring import (AUTO_FRACTION, LOGITS_TOKENS, Batch, forward_bytes_per_token, plan_batches,
                                           score_all, scoring_bytes)
    from ckptinspect.probe.stream import StreamedMain, chunk_rows, stream_estimate

    if store not in STORES:
        raise ProbeError(f"unknown stream store {store!r} ({', '.join(STORES)})")
    cfg = probe_ckpt.checkpoint.config
    t0 = time.perf_counter()
    prefix = spec.concrete_prefix(cfg.num_hidden_layers)
    per = torch.tensor([], dtype=dtype).element_size()
    mtp_bytes = loader.logical_params(probe_ckpt.metas, lambda n: n.startswith(prefix)) * per
    lengths = [len(s.tokens) for s in sequences]
    chunk_tokens = max(chunk_tokens, 1)
    chunks_all = chunk_rows(lengths, chunk_tokens)
    padded = sum(len(c) * max(lengths[i] for i in c) for c in chunks_all)
    chunk_peak = max(len(c) * max(lengths[i] for i in c) for c in chunks_all)
    fwd = forward_bytes_per_token(cfg, dtype)

    def scratch_at(rows, width, block, logits_tokens=LOGITS_TOKENS):
        return scoring_bytes(rows, width, cfg.vocab_size or 0, cfg.hidden_size, common["steps"], dtype,
                             cfg.num_attention_heads or 0, block, 0, logits_tokens, fwd)

    def estimate_at(store_tokens, scoring=0):
        return dict(stream_estimate(probe_ckpt, dtype, chunk_tokens=chunk_peak, forward_per_token=fwd,
                                    store_tokens=store_tokens, mtp_bytes=mtp_bytes, scoring=scoring))

    base = estimate_at(0)
    fixed = base["resident"] + base["mtp"]
    if base["total"] > limit:
        raise ProbeError(f"even layer-streamed the probe needs about {base['total'] / 2**30:.1f} GiB (one layer x2 "
                         f"{base['layer'] / 2**30:.1f} GiB, one chunk of {chunk_peak} tokens "
                         f"{base['chunk'] / 2**30:.1f} GiB, resident {base['resident'] / 2**30:.1f} GiB, MTP layer "
                         f"{base['mtp'] / 2**30:.1f} GiB) but {limit / 2**30:.1f} GiB is available; the corpus size "
                         "does not matter (its activations wait in host memory): use --main-url, or a GPU with "
                         "more memory", path=model_dir)
    chosen, rounds = plan_store(lambda n: estimate_at(n)["total"], padded, cfg.hidden_size * per, limit, store,
                                host_budget(host_limit))
    store_tokens = padded if chosen == "device" else 0
    # scoring batches fit what the layer phase leaves (the two phases do not overlap)
    budget = int(limit * AUTO_FRACTION) - fixed - store_tokens * cfg.hidden_size * per
    batches_all = plan_batches(lengths, max_rows, budget, scratch_at, heads=cfg.num_attention_heads or 1,
                               source=model_dir)
    scoring_peak = max(scratch_at(len(b.indices), b.width, b.attention_block, b.logits_tokens) for b in batches_all)
    estimate = estimate_at(store_tokens, scoring_peak)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    config = hf_config(model_dir, dict(cfg.raw), spec, trust_remote_code)
    streamed = StreamedMain(model_dir, probe_ckpt, config, dtype=dtype, device=device, chunk_tokens=chunk_tokens,
                            store=chosen)
    main = streamed.model
    experts = loader.set_experts_implementation(main, experts_implementation, decode_on_gpu=False)
    head = build_head(spec, main, model_dir, model_dir, probe_ckpt.metas)
    timings["load"] = time.perf_counter() - t0
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    first_device = next(main.get_decoder().norm.parameters()).device
    tallies: dict = {}
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    share = -(-sum(lengths) // rounds)  # tokens per round: contiguous runs of the length-sorted corpus
    groups: list[list[int]] = [[]]
    filled = 0
    for i in order:
        if groups[-1] and filled + lengths[i] > share:
            groups.append([])
            filled = 0
        groups[-1].append(i)
        filled += lengths[i]
    for group in groups:
        chunks = [[group[k] for k in rows] for rows in chunk_rows([lengths[i] for i in group], chunk_tokens)]
        ids = []
        where: dict[int, tuple[int, int]] = {}
        for c, rows in enumerate(chunks):
            width = max(lengths[i] for i in rows)
            block = torch.full((len(rows), width), pad, dtype=torch.long)
            for j, i in enumerate(rows):  # right padding: causal attention never looks at it
                block[j, :lengths[i]] = torch.tensor(sequences[i].tokens)
                where[i] = (c, j)
            ids.append(block)
        t0 = time.perf_counter()
        finals = streamed.hidden_chunks(ids)
        timings["hidden_forward"] = timings.get("hidden_forward", 0.0) + time.perf_counter() - t0

        def hidden_for(indices, n, finals=finals, where=where):
            rows = []
            for i in indices:
                c, j = where[i]
                h = finals[c][j, :n]
                if h.shape[0] < n:  # a narrower chunk: zeros where the batch pads (never scored)
                    h = torch.cat([h, h.new_zeros(n - h.shape[0], h.shape[1])])
                rows.append(h)
            return torch.stack(rows).to(first_device, non_blocking=True)

        mine = [i for rows in chunks for i in rows]
        local = plan_batches([lengths[i] for i in mine], max_rows, budget, scratch_at,
                             heads=cfg.num_attention_heads or 1, source=model_dir)
        local = [Batch(tuple(mine[k] for k in b.indices), b.width, b.attention_block, b.logits_tokens) for b in local]
        for cat, t in score_all(main, head, sequences, common["steps"], mode=mode, temperature=common["temperature"],
                                batches=local, pad_id=pad, device=first_device, progress=progress,
                                timings=timings, hidden_for=hidden_for).items():
            tallies.setdefault(cat, Tally(common["steps"])).merge(t)
        del finals
    streamed.stats.rounds = len(groups)
    peak = int(torch.cuda.max_memory_allocated(device)) if device.startswith("cuda") else None
    streaming = Streaming(streamed.stats, estimate, limit, need, peak)
    return build_result(**common, mode=mode, tallies=tallies, devices=[device],
                        dtype=str(dtype).replace("torch.", ""), main_source="layer-streamed transformers",
                        dequantized=any(loader.quant_kind(n, probe_ckpt.metas) in loader.DEQUANTIZERS
                                        for n in probe_ckpt.metas),
                        timings=timings, streaming=streaming,
                        extra={"tokens_scored": sum(lengths), **(batch_info or {}),
                               "batch_size": max(len(b.indices) for b in batches_all),
                               "attention": attention_counts(batches_all),
                               "experts_implementation": experts})


def attention_counts(batches) -> dict[str, int]:
    """How many scoring batches used the dense stream mask and how many the blocked attention."""
    blocked = sum(b.attention_block is not None for b in batches)
    return {"dense_batches": len(batches) - blocked, "blocked_batches": blocked}
