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


class StreamFloorError(ProbeError):
    """The budget is under what a streamed run needs at its smallest (``floor_bytes``); ``parts``: the
    bytes of each part the message names (resident, mtp, layer, next_layer, transient, chunk, scoring)."""

    def __init__(self, message: str, *, floor_bytes: int, path: str | None = None,
                 parts: dict[str, int] | None = None) -> None:
        super().__init__(message, path=path)
        self.floor_bytes = floor_bytes
        self.parts = dict(parts or {})


# The layer phase's chunk when the budget allows more: on an H200 (BENCHMARKS.md section 11) chunks of
# 16k-67k tokens ran within timing noise, and one forward of 300k tokens allocated past the estimate.
DEFAULT_CHUNK_TOKENS = 32768
# The device store (no host copies) is taken only where it leaves the chunk at least this many tokens:
# a smaller chunk costs more per token than the store's host copies (BENCHMARKS.md section 11).
DEVICE_STORE_MIN_CHUNK = 8192


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.2f} MiB"


def run_streamed(model_dir: str, probe_ckpt, spec, sequences: list[Sequence], tok, *, common: dict, mode: str,
                 device: str, dtype: torch.dtype, max_rows: int, progress: bool, need: int, limit: int,
                 chunk_tokens: int | None, timings: dict[str, float], trust_remote_code: bool = False,
                 experts_implementation: str = "auto", batch_info: dict | None = None, store: str = "auto",
                 host_limit: int | None = None):
    """``chunk_tokens``: the layer phase's padded tokens per chunk at most (None: DEFAULT_CHUNK_TOKENS);
    the run takes the largest chunk that fits ``limit`` beside the resident parts, the MTP layer, the
    layer computing and the next one read ahead; a sequence longer than the chunk runs through each
    layer in pieces (``stream.StreamedMain._layer_in_pieces``) and its chain in slices of starts where its
    whole chain does not fit (``chain.run_chain(start_slice=...)``). The floor (refused below, naming its
    parts): those parts, the longest sequence in pieces of ``stream.PIECE_ALIGN`` tokens with its per-token
    terms (its keys, its residual stream), and its scoring scratch with the chain in slices of one start."""
    from ckptinspect.probe.result import Streaming, build_result
    from ckptinspect.probe.heads.build import build_head
    from ckptinspect.probe.scoring import (ATTENTION_MIN_BLOCK, AUTO_FRACTION, LOGITS_TOKENS, Batch, attention_dims,
                                           forward_bytes_per_token, linear_attention_bytes_per_token, plan_batches,
                                           score_all, scoring_bytes, sliced_scoring_bytes, PREFERRED_SLICE,
                                           SLICE_STARTS)
    from ckptinspect.probe.stream import (PIECE_ALIGN, StreamedMain, chunk_bytes, chunk_room, chunk_rows, piece_room,
                                          piece_sequence_bytes, stream_estimate)

    if store not in STORES:
        raise ProbeError(f"unknown stream store {store!r} ({', '.join(STORES)})")
    if device.startswith("cuda"):  # the peak counter below needs an initialised CUDA (a fresh process has none)
        torch.cuda.init()
    cfg = probe_ckpt.checkpoint.config
    t0 = time.perf_counter()
    prefix = spec.concrete_prefix(cfg.num_hidden_layers)
    per = torch.tensor([], dtype=dtype).element_size()
    mtp_bytes = loader.logical_params(probe_ckpt.metas, lambda n: n.startswith(prefix)) * per
    lengths = [len(s.tokens) for s in sequences]
    longest = max(lengths)
    fwd = forward_bytes_per_token(cfg, dtype)
    linear = linear_attention_bytes_per_token(cfg, per)  # for every token of a chunk at once (stream.chunk_bytes)
    row_bytes = cfg.hidden_size * per

    def scratch_at(rows, width, block, logits_tokens=LOGITS_TOKENS):
        return scoring_bytes(rows, width, cfg.vocab_size or 0, cfg.hidden_size, common["steps"], dtype,
                             cfg.num_attention_heads or 0, block, 0, logits_tokens, fwd, head_dims=attention_dims(cfg))

    def sliced_at(rows, width, block, starts):
        return sliced_scoring_bytes(rows, width, cfg.vocab_size or 0, cfg.hidden_size, common["steps"], dtype,
                                    cfg.num_attention_heads or 0, block, 0, starts, fwd, head_dims=attention_dims(cfg))

    def batch_scratch(b: Batch) -> int:
        if b.start_slice is not None:
            return sliced_at(len(b.indices), b.width, b.attention_block, b.start_slice)
        return scratch_at(len(b.indices), b.width, b.attention_block, b.logits_tokens)

    def estimate_at(store_tokens, chunk_peak, scoring=0, load_ahead=False, pieces=0):
        return dict(stream_estimate(probe_ckpt, dtype, chunk_tokens=chunk_peak, forward_per_token=fwd,
                                    store_tokens=store_tokens, mtp_bytes=mtp_bytes, scoring=scoring,
                                    load_ahead=load_ahead, sequence_per_token=linear, pieces=pieces))

    def padded_at(chunk: int) -> tuple[int, int]:
        """(padded tokens of the corpus, the largest chunk's that runs whole): a sequence longer than
        the chunk runs in pieces (``pieces_at``), its bytes counted there."""
        rows = chunk_rows(lengths, chunk)
        return (sum(len(c) * max(lengths[i] for i in c) for c in rows),
                max((len(c) * max(lengths[i] for i in c) for c in rows if len(c) > 1 or lengths[c[0]] <= chunk),
                    default=0))

    def pieces_at(piece: int) -> int:  # the longest sequence through a layer in pieces of ``piece`` tokens
        return chunk_bytes(piece, fwd, cfg.hidden_size, per, linear) + piece_sequence_bytes(cfg, longest, piece, per)

    bare = estimate_at(0, 0)
    fixed = bare["resident"] + bare["mtp"]
    # the longest sequence through a layer: whole, or in pieces of PIECE_ALIGN tokens with its keys /
    # states in transformers' cache (stream.StreamedMain._layer_in_pieces), whichever is smaller
    floor_piece = min(longest, PIECE_ALIGN)
    longest_bytes = min(chunk_bytes(longest, fwd, cfg.hidden_size, per, linear), pieces_at(floor_piece))
    layer_floor = bare["total"] + longest_bytes
    # the chain of the longest sequence at its smallest: whole with the smallest blocks and logits chunks,
    # or in slices of one start (what stays per start of the document: its hidden state and stream-1 keys)
    least_scratch = min(scratch_at(1, longest, None, LOGITS_TOKENS >> 7),
                        scratch_at(1, longest, ATTENTION_MIN_BLOCK, LOGITS_TOKENS >> 7),
                        sliced_at(1, longest, ATTENTION_MIN_BLOCK, SLICE_STARTS[-1]))
    scoring_floor = -(-(fixed + least_scratch) // AUTO_FRACTION)
    floor = int(max(layer_floor, scoring_floor)) + 64  # + rounding of the budget's fraction
    if limit < floor:
        raise StreamFloorError(
            f"even layer-streamed the probe needs at least {_gib(floor)} and {_gib(limit)} is available: resident "
            f"{_gib(bare['resident'])}, MTP layer {_gib(bare['mtp'])}, one layer {_gib(bare['layer'])} and the next "
            f"read ahead {_gib(bare['next_layer'])}, a dequantization transient {_gib(bare['transient'])}, the longest "
            f"sequence ({longest} tokens) through a layer in pieces of {floor_piece} tokens with its keys and "
            f"residual stream {_gib(longest_bytes)}, and in the scoring phase the same resident parts and MTP layer "
            f"with that sequence's scoring scratch (its MTP chain in slices of {SLICE_STARTS[-1]} start) "
            f"{_gib(least_scratch)} in {AUTO_FRACTION:.0%} of the budget; the corpus size does not matter (it is "
            "streamed in chunks sized to the budget), nor a document's length beyond these per-token terms (it runs "
            "in pieces and slices sized to the budget): allow at least that much with --max-gpu-memory, use "
            "--main-url, or a GPU with more memory",
            floor_bytes=floor, path=model_dir,
            parts={"resident": bare["resident"], "mtp": bare["mtp"], "layer": bare["layer"],
                   "next_layer": bare["next_layer"], "transient": bare["transient"], "chunk": longest_bytes,
                   "scoring": least_scratch})
    cap = max(chunk_tokens or DEFAULT_CHUNK_TOKENS, 1)

    def room(store_tokens: int) -> int:  # padded tokens a chunk may hold beside the store
        return chunk_room(limit - bare["total"] - store_tokens * row_bytes, fwd, cfg.hidden_size, per, linear)

    # a sequence longer than the chunk is a chunk of its own (chunk_rows): the room must hold the longest
    chosen, rounds, chunk = "host", 1, min(cap, room(0))
    if store in ("auto", "device"):
        padded, _ = padded_at(min(cap, room(0)))
        dev_room = room(padded)
        if dev_room >= longest:
            padded, _ = padded_at(min(cap, dev_room))
            dev_room = room(padded)
        scoring_fits = int(limit * AUTO_FRACTION) - fixed - padded * row_bytes >= least_scratch
        if store == "device" or (scoring_fits and dev_room >= max(longest, min(cap, DEVICE_STORE_MIN_CHUNK))):
            chosen, chunk = "device", max(1, min(cap, dev_room))
    padded, chunk_peak = padded_at(chunk)
    # a sequence longer than the chunk runs through each layer in pieces, the largest that fit beside the store
    piece = None
    if longest > chunk:
        available = limit - bare["total"] - (padded * row_bytes if chosen == "device" else 0)
        piece = max(1, min(chunk, piece_room(available, longest, cfg, fwd, per, linear)))
    if chosen == "host":
        rounds = max(1, -(-padded * row_bytes // max(host_budget(host_limit), 1)))
    store_tokens = padded if chosen == "device" else 0
    # scoring batches fit what the layer phase leaves (the two phases do not overlap)
    budget = int(limit * AUTO_FRACTION) - fixed - store_tokens * row_bytes
    batches_all = plan_batches(lengths, max_rows, budget, scratch_at, heads=cfg.num_attention_heads or 1,
                               source=model_dir, sliced_at=sliced_at, prefer_sliced_from=PREFERRED_SLICE)
    scoring_peak = max(batch_scratch(b) for b in batches_all)
    long_bytes = pieces_at(piece) if piece else 0
    estimate = estimate_at(store_tokens, chunk_peak, scoring_peak, pieces=long_bytes)
    # The next layer's load runs beside this layer's compute only where the budget holds it as it is
    # (the chunk and the batches are not shrunk for it: a smaller chunk costs more than the load saves)
    ahead = estimate_at(store_tokens, chunk_peak, scoring_peak, load_ahead=True, pieces=long_bytes)
    load_ahead = load_ahead_allowed(device, ahead["total"], limit)
    if load_ahead:
        estimate = ahead
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    config = hf_config(model_dir, dict(cfg.raw), spec, trust_remote_code)
    streamed = StreamedMain(model_dir, probe_ckpt, config, dtype=dtype, device=device, chunk_tokens=chunk,
                            store=chosen, load_ahead=load_ahead, piece_tokens=piece)
    streamed.stats.chunk_tokens = chunk
    streamed.stats.piece_tokens = piece
    main = streamed.model
    experts = loader.set_experts_implementation(main, experts_implementation, decode_on_gpu=False)
    head = build_head(spec, main, model_dir, model_dir, probe_ckpt.metas)
    timings["load"] = time.perf_counter() - t0
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    first_device = next(main.get_decoder().norm.parameters()).device
    tallies: dict = {}
    kernels: set[str] = set()  # causal attention kernels the chain ran (attention_counts)
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
        chunks = [[group[k] for k in rows] for rows in chunk_rows([lengths[i] for i in group], chunk)]
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
                             heads=cfg.num_attention_heads or 1, source=model_dir, sliced_at=sliced_at,
                             prefer_sliced_from=PREFERRED_SLICE)
        local = [Batch(tuple(mine[k] for k in b.indices), b.width, b.attention_block, b.logits_tokens, b.start_slice)
                 for b in local]
        for cat, t in score_all(main, head, sequences, common["steps"], mode=mode, temperature=common["temperature"],
                                batches=local, pad_id=pad, device=first_device, progress=progress,
                                timings=timings, hidden_for=hidden_for, kernels=kernels).items():
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
                               "attention": attention_counts(batches_all, kernels),
                               "experts_implementation": experts})


def load_ahead_allowed(device: str, ahead_total: int, limit: int) -> bool:
    """Whether the streamed run loads layer i+1 while layer i computes: on a GPU (a side stream runs the
    dequantization beside the compute; on a CPU it would only take turns with it) and where the
    estimate with a second dequantized layer and a second read ahead fits the limit."""
    return device.startswith("cuda") and ahead_total <= limit


def attention_counts(batches, kernels: set[str] | None = None) -> dict:
    """How many scoring batches were planned with whole-sequence attention scratch and how many with
    the blocked long-document attention, and which causal kernels the chain's attention ran
    (stream_attention.causal_attention_lse: a fused one, or "math" where none took the shape); where
    some batch took the chain in slices of starts (scoring.plan_batches: a document over
    PREFERRED_SLICE starts, or one whose whole chain does not fit), how many and the smallest slice."""
    blocked = sum(b.attention_block is not None for b in batches)
    out = {"dense_batches": len(batches) - blocked, "blocked_batches": blocked, "causal_kernels": sorted(kernels or ())}
    sliced = [b.start_slice for b in batches if getattr(b, "start_slice", None) is not None]
    if sliced:
        out.update(sliced_batches=len(sliced), start_slice=min(sliced))
    return out
