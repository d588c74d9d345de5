"""`plan` for a GGUF checkpoint: a llama-server command with the MTP flags, the context and the GPU layers
that fit, and a reason for every flag. Flag names come from rules/engines/llamacpp.yaml ``flags``.

Memory model (llama.cpp src/llama-model.cpp ``load_tensors``: ``-ngl N`` offloads the last N repeating
blocks, the output head goes with them once every block is offloaded, ``token_embd`` stays in host
memory; src/llama-kv-cache.cpp: a layer's K/V cache lives where the layer runs): per GPU a fixed
reserve for compute buffers and the CUDA context, then the KV cache of the offloaded layers at the
planned context, then as many blocks as fit. What each layer caches is the one KV model of every plan
(plan/kvcache.py ``layer_kv_bytes``: K and V of its KV heads per token, MLA / DSA latent rows, a
sliding-window layer at most its window, a linear-attention layer its fixed state) at 2-byte
elements (llama-server's default ``--cache-type-k`` / ``-v`` f16), one device per layer (no tensor
parallelism). The NextN block runs on the target's context and device: with MTP on it counts as one
more layer. Layers split over several GPUs by layer
(llama.cpp's default ``--split-mode layer``), so memory adds up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptinspect.errors import PlanError
from ckptinspect.plan.kvcache import layer_kv_bytes
from ckptinspect.records import Checkpoint, MtpAssessment

if TYPE_CHECKING:
    from ckptinspect.plan.gpus import GpuSpec

GIB = 1024 ** 3
RESERVE_BYTES = int(1.5 * GIB)  # per GPU: CUDA context + compute buffers at the default -b / -ub
USABLE_SHARE = 0.95  # of each GPU's memory; the rest is left to the driver and fragmentation
MIN_CONTEXT = 4096
DEFAULT_CONTEXT_CAP = 131072  # without --context: the model's context_length, at most this
# llama-server's default --cache-type-k / -v is f16: 2-byte elements, as the bf16 entry of
# rules/engines/common.yaml kv_dtype_bytes counts them.
KV_DTYPE = "bf16"
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class LlamaCppFlag:
    flag: str
    value: str | None  # None: a switch without a value
    reason: str
    source: str


@dataclass(frozen=True)
class LlamaCppPlan:
    """A llama-server launch for one GGUF (rendered by render/llamacpp_plan_out.py)."""

    ok: bool
    engine_version: str
    gpu: str
    gpus: int
    context: int
    gpu_layers: int  # blocks offloaded (main + NextN when MTP is on)
    total_layers: int
    mtp: str  # the llama.cpp verdict: ready | degraded | unusable | absent
    mtp_on: bool
    weight_bytes: int  # every tensor llama-server loads (companion head included when used)
    gpu_weight_bytes: int
    kv_bytes: int  # KV cache on the GPUs at `context`
    gpu_bytes: int  # usable GPU memory, all GPUs
    flags: tuple[LlamaCppFlag, ...]
    command: tuple[str, ...]
    notes: tuple[str, ...]


def _kv(ck: Checkpoint, blocks: "list[int] | dict[int, int]", context: int) -> int:
    """KV bytes of ``blocks`` for one request of ``context`` tokens (plan/kvcache.py's model, per layer)."""
    return int(sum(layer_kv_bytes(ck, bid, context, KV_DTYPE) for bid in blocks))


def plan_llamacpp(ck: Checkpoint, mtp: MtpAssessment, *, gpu: "str | GpuSpec", gpus: int, context: int | None = None) -> LlamaCppPlan:
    from ckptinspect.plan.gpus import find_gpu
    from ckptinspect.rules.gguf_engine import gguf_engine_rules

    if ck.format != "gguf":
        raise PlanError("llama.cpp plans are made for GGUF checkpoints")
    spec = find_gpu(gpu)
    rules = gguf_engine_rules()
    flags_rules = rules["flags"]
    verdict = mtp.verdicts["llamacpp"]
    mtp_on = verdict.verdict in ("ready", "degraded")
    layers = ck.config.num_hidden_layers
    block_bytes: dict[int, int] = {}
    other = 0
    for g in ck.inventory.groups:
        bid = g.index if g.pattern.startswith("blk.") else None
        if bid is None:
            other += g.bytes if not g.pattern.startswith("token_embd") else 0
        elif g.mtp_layer is None or mtp_on:
            block_bytes[bid] = block_bytes.get(bid, 0) + g.bytes
    companion = _companion(ck, mtp) if mtp_on else None
    if companion:
        block_bytes[layers] = block_bytes.get(layers, 0) + mtp.bytes
    total_layers = len(block_bytes)
    gpu_bytes = int(gpus * (spec.memory_gib * GIB * USABLE_SHARE - RESERVE_BYTES))
    want = context or min(ck.config.max_position_embeddings or DEFAULT_CONTEXT_CAP, DEFAULT_CONTEXT_CAP)
    ctx, notes = want, []
    # Halve the context while its KV cache alone would take over half the GPUs (weights need the rest).
    while ctx > MIN_CONTEXT and context is None and _kv(ck, block_bytes, ctx) > gpu_bytes // 2:
        ctx //= 2
    if ctx < want:
        notes.append(f"context lowered from {want:,} to {ctx:,} so the KV cache leaves room for the weights")
    # the output head is counted against the GPUs from the start (it joins them once every block is there)
    fitted, used, gpu_weights = 0, other, 0
    for bid in sorted(block_bytes, reverse=True):  # -ngl offloads the last blocks first
        need = block_bytes[bid] + _kv(ck, [bid], ctx)
        if used + need > gpu_bytes:
            break
        used += need
        gpu_weights += block_bytes[bid]
        fitted += 1
    all_in = fitted == total_layers
    flag_rows = _flags(ck, mtp, flags_rules, verdict.verdict, ctx, fitted, all_in, total_layers, companion)
    command = (rules["launcher"],) + tuple(x for f in flag_rows for x in ((f.flag,) if f.value is None else (f.flag, f.value)))
    if not all_in:
        # what would put them on the GPUs, on the card the user has (never another card)
        notes.append(f"{total_layers - fitted} of {total_layers} blocks stay in host memory (slower); more "
                     f"{spec.name} GPUs or a smaller quant offloads them")
    if gpus > 1:
        notes.append(f"layers are split over the {gpus} GPUs by layer (llama-server's default --split-mode layer)")
    return LlamaCppPlan(ok=True, engine_version=verdict.engine_version, gpu=spec.name, gpus=gpus, context=ctx,
                        gpu_layers=fitted, total_layers=total_layers, mtp=verdict.verdict, mtp_on=mtp_on,
                        weight_bytes=sum(block_bytes.values()) + other, gpu_weight_bytes=gpu_weights + (other if all_in else 0),
                        kv_bytes=_kv(ck, sorted(block_bytes)[total_layers - fitted:], ctx),
                        gpu_bytes=gpu_bytes, flags=tuple(flag_rows),
                        command=command, notes=tuple(notes))


def _companion(ck: Checkpoint, mtp: MtpAssessment) -> str | None:
    own = {s.name for s in ck.inventory.shards}
    for layer in mtp.layers:
        for shard in layer.shards:
            if shard not in own:
                return shard
    return None


def _path(ck: Checkpoint, name: str) -> str:
    return name if ck.kind == "hub" else f"{ck.location.rstrip('/')}/{name}"


def _flags(ck: Checkpoint, mtp: MtpAssessment, rules: dict, verdict: str, ctx: int, fitted: int, all_in: bool,
           total: int, companion: str | None) -> list[LlamaCppFlag]:
    first = ck.inventory.shards[0].name
    split = len(ck.inventory.shards) > 1
    rows = [
        LlamaCppFlag(rules["model"]["flag"], _path(ck, first),
                     "the first part of the split set: llama.cpp opens the other parts itself" if split
                     else "the model file", rules["model"]["source"]),
        LlamaCppFlag(rules["context"]["flag"], str(ctx), "context that fits next to the weights "
                     f"({ck.config.max_position_embeddings or 'unknown':,} trained)" if isinstance(ck.config.max_position_embeddings, int)
                     else "context that fits next to the weights", rules["context"]["source"]),
        LlamaCppFlag(rules["gpu_layers"]["flag"], "999" if all_in else str(fitted),
                     f"all {total} blocks and the output head fit on the GPU(s)" if all_in
                     else f"{fitted} of {total} blocks fit with the KV cache; the rest run from host memory",
                     rules["gpu_layers"]["source"]),
    ]
    if verdict in ("ready", "degraded"):
        spec_type, n_max = rules["spec_type"], rules["draft_n_max"]
        rows.append(LlamaCppFlag(spec_type["flag"], str(spec_type["value"]),
                                 f"the NextN head ({mtp.present_layers} layer(s)) drafts tokens", spec_type["source"]))
        n = 2 if verdict == "degraded" else int(n_max["value"])
        rows.append(LlamaCppFlag(n_max["flag"], str(n), "short drafts: the head is quantized low, measure acceptance"
                                 if verdict == "degraded" else "drafts per step for a NextN head", n_max["source"]))
        if companion:
            dm = rules["draft_model"]
            rows.append(LlamaCppFlag(dm["flag"], _path(ck, companion), "the head ships in a separate file", dm["source"]))
        if "parallel" in rules:
            par = rules["parallel"]
            rows.append(LlamaCppFlag(par["flag"], str(par["value"]), "one slot: MTP drafting is per sequence",
                                     par["source"]))
    return rows
