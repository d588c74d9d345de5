"""Layer-streamed main model: for checkpoints larger than the device memory (teacher mode).

The model is built by transformers on the ``meta`` device, so its own forward (masks, positions,
rotary, per-layer attention types) drives the computation; nothing of the decoder is re-implemented.
The embedding, final norm, rotary and LM head stay resident. The corpus is cut into chunks of whole
sequences (``chunk_tokens`` padded tokens each) and the layers are taken one at a time: a layer's
tensors are read from the shards (only those the report's inventory lists for it), dequantized on the
device (``dequant.py``), loaded with ``load_state_dict(assign=True)`` (no copy), every chunk runs
through it, and it goes back to ``meta`` (freed) before the next layer is read. Each layer's call
arguments (masks, position embeddings) come from transformers' own decoder forward run on the chunk
with the layers replaced by a capture (``_capture``). Between layers each chunk's residual stream
waits in the *store*: on the device when the corpus's fits the budget, else in pinned host memory
(copied in and out per chunk and layer). A sequence longer than the chunk runs through each layer in
pieces, its attention keys / linear-attention states carried in transformers' own cache
(``_layer_in_pieces``). Device memory is therefore bounded by one layer + the resident parts + one
chunk's or piece's activations (+ a long sequence's per-token keys and residual stream), whatever the
corpus size (streamed_run.py takes the corpus in rounds when even the host cannot hold its activations).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass, field
from typing import Mapping

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader
from ckptinspect.probe.chain import MLP_PIECE_TOKENS, mlp_in_pieces
from ckptinspect.probe.heads.fusion import EXPERT_TENSOR
from ckptinspect.probe.layer_reader import LayerReader, layer_names


@dataclass
class StreamStats:
    layers: int = 0
    bytes_read: int = 0  # stored (quantized) bytes read from the shards for the decoder layers
    read_s: float = 0.0  # reading the layers' stored bytes from the shards (a background thread)
    load_s: float = 0.0  # waiting for the read, copying to the device, dequantizing, fusing, assigning
    compute_s: float = 0.0  # running the tokens through the layers
    wall_s: float = 0.0  # the layer loop's wall time: load_s + compute_s (the reads overlap the compute)
    max_layer_bytes: int = 0  # largest dequantized layer, bytes on the device
    per_layer: list[dict[str, float]] = field(default_factory=list)
    store: str = "device"  # where the residual stream waits between layers: device | host
    store_bytes_moved: int = 0  # host <-> device copies of the residual stream (store "host")
    rounds: int = 1  # passes over the layers (the corpus taken in rounds when the host cannot hold it)
    chunk_tokens: int = 0  # padded tokens per chunk (sized to the budget unless given)
    piece_tokens: int | None = None  # a sequence longer than the chunk: tokens per piece through a layer
    overlapped: bool = False  # whether layer i+1 was read while layer i computed
    load_ahead: bool = False  # whether layer i+1 was dequantized (side stream) while layer i computed



def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _local(name: str, layer: int) -> str:
    marker = f"layers.{layer}."
    at = name.find(marker)
    if at < 0:
        raise ProbeError(f"tensor {name!r} of decoder layer {layer} has no '{marker}' in its name")
    return name[at + len(marker):]


class StreamedMain:
    """The main model with streamed decoder layers; ``model`` is a transformers CausalLM."""

    def __init__(self, model_dir: str, probe_ckpt, hf_config, *, dtype: torch.dtype, device: str,
                 chunk_tokens: int = 32768, store: str = "device", load_ahead: bool = False,
                 piece_tokens: int | None = None) -> None:
        """``load_ahead``: dequantize layer i+1 while layer i computes (``hidden_chunks``); the caller
        allows it only where the memory estimate holds a second dequantized layer and a second read
        ahead (``stream_estimate(load_ahead=True)``). ``piece_tokens``: a sequence longer than this
        runs through each layer this many tokens at a time (``_layer_in_pieces``); None: whole."""
        from transformers import AutoModelForCausalLM

        self.model_dir, self.metas, self.inventory = model_dir, probe_ckpt.metas, probe_ckpt.inventory
        self.dtype, self.device, self.chunk_tokens = dtype, torch.device(device), chunk_tokens
        # The in-memory path dequantizes into a BF16 copy when computing in FP32 (loader.prepare_loadable_dir);
        # reading at the same precision keeps the two paths' numbers identical.
        self.read_dtype = (torch.bfloat16 if dtype == torch.float32 and loader.needs_dequant(self.metas) else dtype)
        self.stats = StreamStats(store=store, load_ahead=load_ahead)
        self.piece_tokens = piece_tokens
        self.load_ahead = load_ahead
        self.store = torch.device("cpu") if store == "host" else self.device
        self._mode: tuple | None = None  # ("capture", layer index, box) or ("replay", final hidden)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        self.model = model.eval()
        decoder = model.get_decoder()
        self.layers = decoder.layers
        self._load_resident(decoder)
        self._originals = [layer.forward for layer in self.layers]
        for i, layer in enumerate(self.layers):
            layer.forward = self._stand_in(i)

    # -- resident parts -----------------------------------------------------------------------
    def _load_resident(self, decoder) -> None:
        layer_keys = {f"{name}." for name, mod in self.model.named_modules() if mod is self.layers}
        wanted = [k for k in self.model.state_dict() if not any(k.startswith(p) for p in layer_keys)]
        main_names = {n for g in self.inventory.groups if g.mtp_layer is None and g.layer is None
                      and g.component != "vision" for n in g.names()}
        chosen: dict[str, str] = {}
        for key in wanted:
            if key in main_names:
                chosen[key] = key
                continue
            tail = key.split(".", 1)[-1]  # a wrapper prefix differs (model.language_model. vs model.)
            hits = [n for n in main_names if n.endswith("." + tail) or n == tail]
            if len(hits) != 1:
                if key == "lm_head.weight" and getattr(self.model.config.get_text_config(), "tie_word_embeddings",
                                                       False):
                    continue
                raise ProbeError(f"cannot place resident tensor {key!r} of the main model "
                                 f"({'no' if not hits else len(hits)} checkpoint tensor(s) match)", path=self.model_dir)
            chosen[key] = hits[0]
        by_ckpt = {v: k for k, v in chosen.items()}
        state = {by_ckpt[n]: t for n, t in loader.iter_tensors(self.model_dir, self.metas, lambda n: n in by_ckpt,
                                                                 self.read_dtype, device=self.device)}
        self.model.load_state_dict({k: v.to(self.dtype) for k, v in state.items()}, strict=False, assign=True)
        if getattr(self.model.config.get_text_config(), "tie_word_embeddings", False):
            self.model.tie_weights()
        rotary = getattr(decoder, "rotary_emb", None)
        if rotary is not None:  # only non-persistent buffers: rebuild them on the device
            with torch.device(self.device):
                decoder.rotary_emb = type(rotary)(config=rotary.config)
        left = [n for n, t in list(self.model.named_parameters()) + list(self.model.named_buffers())
                if t.is_meta and not any(n.startswith(p) for p in layer_keys)]
        if left:
            raise ProbeError(f"main-model tensors not found in the checkpoint: {', '.join(left[:5])}",
                             path=self.model_dir)

    # -- one layer ----------------------------------------------------------------------------
    def _layer_state(self, index: int, layer, stored: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """Layer ``index``'s tensors under transformers' names, dequantized on the device; routed
        experts stored one per tensor are written straight into the fused 3-D stack transformers holds
        (never the per-expert tensors and the stack at once: one layer, not two, on the device)."""
        steps = self._layer_state_steps(index, layer, stored)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def _layer_state_steps(self, index: int, layer, stored: Mapping[str, torch.Tensor] | None):
        """``_layer_state`` one checkpoint tensor per step (a generator whose return value is the
        state), so that the load ahead can interleave it with the chunks' compute."""
        names = layer_names(self.inventory, index)
        own = layer.state_dict()
        state: dict[str, torch.Tensor] = {}
        fused: dict[str, torch.Tensor] = {}
        filled: dict[str, int] = {}
        for name, t in loader.iter_tensors(self.model_dir, self.metas, set(names).__contains__, self.read_dtype,
                                           device=self.device, stored=stored):
            local = _local(name, index)
            m = EXPERT_TENSOR.match(local)
            if m is None or f"{m['pre']}.gate_up_proj" not in own:
                state[local] = t
                yield
                continue
            key = f"{m['pre']}.down_proj" if m["proj"] == "down_proj" else f"{m['pre']}.gate_up_proj"
            ref = own.get(key)
            if ref is None:
                raise ProbeError(f"decoder layer {index}: {local} has no fused {key} in transformers' layer",
                                 path=self.model_dir)
            if key not in fused:
                fused[key] = torch.empty(ref.shape, dtype=ref.dtype, device=self.device)
            e, half = int(m["e"]), ref.shape[1] // 2
            if e >= ref.shape[0]:
                raise ProbeError(f"decoder layer {index}: expert {e} over the {ref.shape[0]} experts of {key}",
                                 path=self.model_dir)
            dst = (fused[key][e] if m["proj"] == "down_proj" else
                   fused[key][e, :half] if m["proj"] == "gate_proj" else fused[key][e, half:])
            if tuple(dst.shape) != tuple(t.shape):
                raise ProbeError(f"decoder layer {index}: {local} has shape {tuple(t.shape)}, transformers' {key} "
                                 f"holds {tuple(dst.shape)} per expert", path=self.model_dir)
            dst.copy_(t)
            filled[key] = filled.get(key, 0) + 1
            del t
            yield
        for key, t in fused.items():  # gate and up per expert fill gate_up_proj; down_proj once per expert
            want = t.shape[0] * (1 if key.endswith("down_proj") else 2)
            if filled.get(key, 0) != want:
                raise ProbeError(f"decoder layer {index}: experts under {key} are incomplete ({filled.get(key, 0)} of "
                                 f"{want} tensors)", path=self.model_dir)
        state.update(fused)
        expected = set(own)
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or extra:
            raise ProbeError(f"decoder layer {index}: checkpoint tensors do not match transformers' layer "
                             f"(missing {missing[:3]}, unexpected {extra[:3]})", path=self.model_dir)
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ProbeError(f"decoder layer {index}: {k} has shape {tuple(v.shape)}, transformers expects "
                                 f"{tuple(own[k].shape)}", path=self.model_dir)
        self.stats.bytes_read += sum(self.metas[n].nbytes for n in names)
        return {k: (v.to(own[k].dtype) if v.is_floating_point() else v) for k, v in state.items()}

    def _stand_in(self, index: int):
        """What the decoder calls in place of layer ``index``: in capture mode it records the call's
        arguments (that layer's) and passes the hidden state on unchanged; in replay mode the last
        layer returns the stored final residual stream, so the decoder applies its own final norm."""
        def forward(hidden_states, *args, **kwargs):
            mode = self._mode
            if mode is None:
                raise ProbeError("a streamed decoder layer was called outside StreamedMain.hidden_chunks")
            if mode[0] == "capture":
                if index == mode[1]:
                    mode[2].append((hidden_states, args, kwargs))
                return hidden_states
            return mode[1] if index == len(self.layers) - 1 else hidden_states
        return forward

    def _decoder(self, ids: torch.Tensor, mode: tuple, cache=None, start: int = 0):
        """The decoder's forward over ``ids`` with the layers' stand-ins; ``cache`` / ``start``: a piece
        of a longer sequence from position ``start``, its earlier pieces in ``cache`` (``_layer_in_pieces``)."""
        self._mode = mode
        try:
            if cache is None:
                return self.model.get_decoder()(input_ids=ids.to(self.device), use_cache=False).last_hidden_state
            positions = torch.arange(start, start + ids.shape[1], device=self.device)[None].expand(ids.shape[0], -1)
            decoder = self.model.get_decoder()
            # transformers 5.25 names the decoder's cache argument ``cache``; earlier releases ``past_key_values``
            name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
            return decoder(input_ids=ids.to(self.device), use_cache=True, position_ids=positions,
                           **{name: cache}).last_hidden_state
        finally:
            self._mode = None

    def _piece_cache(self, index: int):
        """transformers' own cache for one sequence's pieces through layer ``index``: its KV (attention)
        or its conv and recurrent states (linear attention), which the layer reads and extends itself.
        Every layer slot is that one layer's: the decoder sizes its masks from the first
        full-attention slot (transformers' create_causal_mask), which in a layer-at-a-time pass must be
        the layer that runs (positions are passed explicitly)."""
        from transformers import DynamicCache

        try:
            from transformers.cache_utils import CacheLayerMixin
        except ImportError as exc:  # fail closed: a release without per-layer cache objects
            raise ProbeError("a sequence longer than the layer phase's chunk runs through each layer in pieces "
                             "with transformers' per-layer cache (transformers 5.25's cache_utils), which this "
                             "transformers lacks: allow more memory with --max-gpu-memory or upgrade transformers",
                             path=self.model_dir) from exc

        cache = DynamicCache(config=self.model.config.get_text_config())
        own = cache.layers
        cache.layers = [own[index]] * len(own)
        if not isinstance(own[index], CacheLayerMixin):
            # a linear-attention layer: the decoder still builds the full-attention mask (unused by this
            # layer), sized against the first attention slot, which stays an empty attention layer
            first = next((k for k, layer in enumerate(own) if isinstance(layer, CacheLayerMixin)), None)
            if first is not None:
                cache.layers[first] = own[first]
        return cache

    def _layer_in_pieces(self, index: int, layer, ids: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """Layer ``index`` over one long sequence ``ids`` [1, n], ``piece_tokens`` at a time, its
        attention's keys / its recurrence's state carried in transformers' cache (``_piece_cache``):
        what exists at once is one piece's activations, the sequence's KV of this layer, and the
        sequence's residual stream in and out (the output filled piece by piece in the store)."""
        n, step = ids.shape[1], max(1, self.piece_tokens or ids.shape[1])
        cache = self._piece_cache(index)
        out_store = None
        for a in range(0, n, step):
            b = min(n, a + step)
            box: list = []
            self._decoder(ids[:, a:b], ("capture", index, box), cache=cache, start=a)
            if len(box) != 1:
                raise ProbeError(f"the decoder called layer {index} {len(box)} times for one forward")
            first, args, kwargs = box[0]
            hidden = first if index == 0 else self._fetch(previous[:, a:b])
            with mlp_in_pieces(layer):
                out = self._originals[index](hidden, *args, **kwargs)
            out = out[0] if isinstance(out, tuple) else out
            if out_store is None:
                out_store = torch.empty((ids.shape[0], n, out.shape[-1]), dtype=out.dtype, device=self.store,
                                        pin_memory=self.store.type == "cpu" and out.device.type == "cuda")
            out_store[:, a:b].copy_(out, non_blocking=True)
            if self.store != out.device:
                self.stats.store_bytes_moved += out.numel() * out.element_size()
            del box, first, args, kwargs, hidden, out
        del cache
        return out_store

    def _long(self, ids: torch.Tensor) -> bool:
        return self.piece_tokens is not None and ids.shape[1] > self.piece_tokens

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in the store: itself on the device, else a pinned host copy (asynchronous; the
        device-side reuse of ``t``'s memory is ordered after the copy on the same stream)."""
        if self.store == t.device:
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
        host.copy_(t, non_blocking=True)
        self.stats.store_bytes_moved += t.numel() * t.element_size()
        return host

    def _fetch(self, t: torch.Tensor) -> torch.Tensor:
        if t.device != self.device:
            self.stats.store_bytes_moved += t.numel() * t.element_size()
        return t.to(self.device, non_blocking=True)

    @torch.no_grad()
    def hidden_chunks(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Post-final-norm hidden states of each id chunk [b, n], one pass over the layers for all
        chunks; returned in the store (device or pinned host memory). Layer i+1's stored bytes are
        read (``layer_reader.LayerReader``: disk -> host buffer -> device, on a thread and a side stream) while
        layer i computes. With ``load_ahead`` the pipeline is one layer deeper: while layer i computes,
        layer i+1 (read during layer i-1) is dequantized on a side stream, its tensors interleaved with
        the chunks, and layer i+2 is read; a layer's load is then only the wait for its state."""
        states: list[torch.Tensor | None] = [None] * len(chunks)
        reader = LayerReader(self)
        ahead = _Ahead(self) if self.load_ahead else None
        try:
            pending = reader.submit(0)
            for index, layer in enumerate(self.layers):
                t0 = time.perf_counter()
                if ahead is not None and ahead.index == index:
                    # its read was waited for (t_wait) in the previous layer's window, not in this one's
                    state, read_s, t_wait = ahead.take()
                    waited_here = 0.0
                else:
                    stored, read_s = pending.result()
                    t_wait = waited_here = time.perf_counter() - t0
                    reader.adopt(stored)
                    state = self._layer_state(index, layer, stored)
                    del stored
                    if index + 1 < len(self.layers):
                        pending = reader.submit(index + 1)
                layer.load_state_dict(state, strict=True, assign=True)
                del state
                stray = [n for n, b in layer.named_buffers() if b.is_meta]
                if stray:
                    raise ProbeError(f"decoder layer {index} has buffers the streamer cannot rebuild: {stray[:3]}")
                _sync(self.device)
                t1 = time.perf_counter()
                if ahead is not None and index + 1 < len(self.layers):
                    # layer i+1's bytes (read during layer i-1, or just now for layer 0) start dequantizing;
                    # layer i+2's read starts beside it
                    stored, next_read_s = pending.result()
                    wait_next = time.perf_counter() - t1
                    if index + 2 < len(self.layers):
                        pending = reader.submit(index + 2)
                    ahead.start(index + 1, stored, next_read_s, wait_next, len(chunks))
                    del stored
                layer_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
                for c, ids in enumerate(chunks):
                    if self._long(ids):
                        states[c] = self._layer_in_pieces(index, layer, ids, states[c])
                        if ahead is not None:
                            ahead.pump()
                        continue
                    box: list = []
                    self._decoder(ids, ("capture", index, box))
                    if len(box) != 1:
                        raise ProbeError(f"the decoder called layer {index} {len(box)} times for one forward")
                    first, args, kwargs = box[0]
                    hidden = first if index == 0 else self._fetch(states[c])
                    with mlp_in_pieces(layer):
                        out = self._originals[index](hidden, *args, **kwargs)
                    states[c] = self._keep(out[0] if isinstance(out, tuple) else out)
                    del box, first, args, kwargs, hidden, out
                    if ahead is not None:
                        ahead.pump()  # a share of layer i+1's tensors, queued behind this chunk's compute
                if ahead is not None:
                    ahead.finish()
                _sync(self.device)
                t2 = time.perf_counter()
                layer.to("meta")  # frees the layer's weights before the next layer is loaded
                self.stats.layers += 1
                self.stats.read_s += read_s
                self.stats.load_s += t1 - t0
                self.stats.compute_s += t2 - t1
                self.stats.wall_s += t2 - t0
                self.stats.max_layer_bytes = max(self.stats.max_layer_bytes, layer_bytes)
                row = {"read_s": read_s, "wait_s": t_wait, "load_s": t1 - t0 - waited_here, "compute_s": t2 - t1,
                       "wall_s": t2 - t0}
                if ahead is not None:  # host seconds spent in this layer's window queueing the next one's load
                    row["load_ahead_s"] = ahead.spent_s
                self.stats.per_layer.append(row)
            self.stats.overlapped = reader.overlaps
        finally:
            reader.close()
        finals = []
        for c, ids in enumerate(chunks):
            if self._long(ids):  # the final norm is per token: piece by piece too
                final = None
                for a in range(0, ids.shape[1], self.piece_tokens):
                    b = min(ids.shape[1], a + self.piece_tokens)
                    part = self._decoder(ids[:, a:b], ("replay", self._fetch(states[c][:, a:b])))
                    if final is None:
                        final = torch.empty((ids.shape[0], ids.shape[1], part.shape[-1]), dtype=part.dtype,
                                            device=self.store,
                                            pin_memory=self.store.type == "cpu" and part.device.type == "cuda")
                    final[:, a:b].copy_(part, non_blocking=True)
                finals.append(final)
            else:
                finals.append(self._keep(self._decoder(ids, ("replay", self._fetch(states[c])))))
            states[c] = None
        _sync(self.device)
        return finals


class _Ahead:
    """The next layer's load, run while the current layer computes (``StreamedMain.load_ahead``): its
    state is built tensor by tensor (``_layer_state_steps``) in shares after each chunk's compute is
    queued, on a side stream on a GPU so the dequantization kernels run beside the compute; the main
    stream waits for it (an event) before the layer runs. The side stream's tensors are recorded as
    used by the main stream, so the allocator does not hand out their memory while the layer runs."""

    def __init__(self, owner: "StreamedMain") -> None:
        self.owner = owner
        cuda = owner.device.type == "cuda"
        self.stream = torch.cuda.Stream(owner.device) if cuda else None
        self.index: int | None = None
        self.steps = None
        self.state: dict[str, torch.Tensor] | None = None
        self.share, self.spent_s, self.read_s, self.wait_s = 1, 0.0, 0.0, 0.0
        self.event = None

    def start(self, index: int, stored, read_s: float, wait_s: float, chunks: int) -> None:
        if self.stream is not None and stored:
            for t in stored.values():  # allocated on the reader's stream, read on this one
                t.record_stream(self.stream)
        self.index, self.read_s, self.wait_s, self.spent_s = index, read_s, wait_s, 0.0
        self.state, self.event = None, None
        self.steps = self.owner._layer_state_steps(index, self.owner.layers[index], stored)
        self.share = max(1, -(-len(layer_names(self.owner.inventory, index)) // max(1, chunks)))

    def pump(self, count: int | None = None) -> None:
        if self.steps is None:
            return
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            for _ in range(self.share if count is None else count):
                try:
                    next(self.steps)
                except StopIteration as done:
                    self.state, self.steps = done.value, None
                    break
        self.spent_s += time.perf_counter() - t0

    def finish(self) -> None:
        while self.steps is not None:
            self.pump(1 << 30)
        if self.stream is not None:
            self.event = torch.cuda.Event()
            self.event.record(self.stream)

    def take(self) -> tuple[dict[str, torch.Tensor], float, float]:
        """(state, read seconds, seconds waited for the read) of the layer loaded ahead."""
        self.finish()
        state, self.state, self.index = self.state, None, None
        if self.stream is not None:
            main = torch.cuda.current_stream(self.owner.device)
            main.wait_event(self.event)
            for t in state.values():
                t.record_stream(main)
        return state, self.read_s, self.wait_s


def chunk_rows(lengths: list[int], chunk_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length, cut into chunks of at most ``chunk_tokens`` padded
    tokens (a longer sequence is a chunk of its own)."""
    chunks: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if chunks and (len(chunks[-1]) + 1) * lengths[i] <= chunk_tokens:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def resident_bytes(probe_ckpt, dtype: torch.dtype) -> int:
    """Device bytes of what stays loaded while streaming: embedding, final norm, LM head."""
    per = torch.tensor([], dtype=dtype).element_size()
    return sum(g.params * per for g in probe_ckpt.inventory.groups
               if g.mtp_layer is None and g.layer is None and g.component != "vision")


def largest_layer_bytes(probe_ckpt, dtype: torch.dtype) -> int:
    per = torch.tensor([], dtype=dtype).element_size()
    sizes: dict[int, int] = {}
    for g in probe_ckpt.inventory.groups:
        if g.layer is not None and g.mtp_layer is None:
            sizes[g.layer] = sizes.get(g.layer, 0) + g.params * per
    return max(sizes.values(), default=0)


def largest_stored_layer_bytes(probe_ckpt) -> int:
    """The largest decoder layer's bytes as stored (quantized where the checkpoint is): what the
    read-ahead holds on the device while the layer before it computes."""
    sizes: dict[int, int] = {}
    for g in probe_ckpt.inventory.groups:
        if g.layer is not None and g.mtp_layer is None:
            sizes[g.layer] = sizes.get(g.layer, 0) + g.bytes
    return max(sizes.values(), default=0)


def stream_estimate(probe_ckpt, dtype: torch.dtype, *, chunk_tokens: int, forward_per_token: int, store_tokens: int,
                    mtp_bytes: int, scoring: int, load_ahead: bool = False,
                    sequence_per_token: int = 0, pieces: int = 0) -> Mapping[str, int]:
    """Peak device bytes of a streamed run: resident parts + the MTP layer + the store's device share
    (``store_tokens`` x hidden: the corpus's residual stream when it waits on the device, 0 when it
    waits in host memory) + the larger of the layer phase and the scoring phase (``scoring`` of the
    largest batch). The layer phase: the layer computing (dequantized, experts written straight into
    their fused stack), the next layer's stored bytes read ahead onto the device, one tensor's
    dequantization transient, and one chunk's layer activations (``scoring.forward_bytes_per_token``
    each, plus its residual stream in and out, ``chunk_bytes``). ``load_ahead``: the layer phase also
    holds the next layer dequantized and the one after it read ahead (``layer_ahead``). ``pieces``:
    the bytes of the longest sequence run in pieces (``chunk_bytes`` of a piece +
    ``piece_sequence_bytes``), where it exceeds the chunk's they are the layer phase's activations."""
    per = torch.tensor([], dtype=dtype).element_size()
    hidden = probe_ckpt.checkpoint.config.hidden_size
    parts = {"resident": resident_bytes(probe_ckpt, dtype), "layer": largest_layer_bytes(probe_ckpt, dtype),
             "next_layer": largest_stored_layer_bytes(probe_ckpt), "transient": tensor_transient_bytes(probe_ckpt),
             "mtp": mtp_bytes,
             "chunk": max(chunk_bytes(chunk_tokens, forward_per_token, hidden, per, sequence_per_token), pieces),
             "store": store_tokens * hidden * per, "scoring": scoring}
    parts["layer_ahead"] = parts["layer"] + parts["next_layer"] if load_ahead else 0
    parts["total"] = (parts["resident"] + parts["mtp"] + parts["store"]
                      + max(parts["layer"] + parts["next_layer"] + parts["transient"] + parts["chunk"]
                            + parts["layer_ahead"], parts["scoring"]))
    return parts


def chunk_bytes(tokens: int, forward_per_token: int, hidden: int, per: int, sequence_per_token: int = 0) -> int:
    """Device bytes of a chunk of ``tokens`` padded tokens in the layer phase: per token the residual
    stream (in, out, the next layer's input) and the layer's hidden-size activations (8 x hidden);
    the MLP's own activations for one piece of chain.MLP_PIECE_TOKENS (the layer's ``mlp`` runs in
    pieces, ``chain.mlp_in_pieces``). ``sequence_per_token``: the part of ``forward_per_token`` that
    exists for every token of the chunk at once, not per MLP piece (a linear-attention layer's
    recurrence, ``scoring.linear_attention_bytes_per_token``)."""
    small, big = _chunk_terms(forward_per_token, hidden, per, sequence_per_token)
    return tokens * small + min(tokens, MLP_PIECE_TOKENS) * big


def _chunk_terms(forward_per_token: int, hidden: int, per: int, sequence_per_token: int) -> tuple[int, int]:
    """(bytes per token of the whole chunk, bytes per token of one MLP piece)."""
    rest = forward_per_token - sequence_per_token
    return (min(rest, 8 * hidden * per) + sequence_per_token + 3 * hidden * per,
            max(0, rest - 8 * hidden * per))


def chunk_room(available: int, forward_per_token: int, hidden: int, per: int, sequence_per_token: int = 0) -> int:
    """The most padded tokens a chunk may hold in ``available`` bytes (inverse of ``chunk_bytes``)."""
    if available <= 0:
        return 0
    small, big = _chunk_terms(forward_per_token, hidden, per, sequence_per_token)
    if available <= MLP_PIECE_TOKENS * (small + big):
        return available // (small + big)
    return MLP_PIECE_TOKENS + (available - MLP_PIECE_TOKENS * (small + big)) // small


# Pieces of a long sequence are a multiple of this where they can be: the linear-attention recurrence's
# chunk of tokens (transformers' and flash-linear-attention's chunk_size), so a piece boundary is a chunk
# boundary of the whole sequence's recurrence; also the floor's piece.
PIECE_ALIGN = 64


def piece_sequence_bytes(cfg, length: int, piece: int, per: int) -> int:
    """Device bytes, beyond one piece's activations (``chunk_bytes(piece)``), of a ``length``-token
    sequence run through a layer ``piece`` tokens at a time (``StreamedMain._layer_in_pieces``):
    - per token of the sequence: the layer's keys and values in transformers' cache (MLA: the
      decompressed per-head ones) twice (the cache's concatenation holds the old and the new at
      once), the GQA-expanded copy transformers' SDPA path makes, and the layer's output filled in the
      store;
    - per piece token and key: the piece's mask over all keys (float32 at most) and the float32
      scores and weights of SDPA's math path where no fused kernel takes the mask;
    - a linear-attention layer's recurrent state (float32, three copies: cached, initial, final) and
      its conv state with the piece appended."""
    from ckptinspect.probe.scoring import attention_dims

    heads = cfg.num_attention_heads or 1
    qk, v = attention_dims(cfg)
    kv_heads = heads if cfg.kv_lora_rank else (cfg.num_key_value_heads or heads)
    per_token = per * (2 * kv_heads * (qk + v) + heads * (qk + v) + cfg.hidden_size)
    scores = piece * length * (8 * heads + 4)
    text = cfg.text if isinstance(getattr(cfg, "text", None), dict) else {}
    v_heads = text.get("linear_num_value_heads") or 0
    state = 0
    if v_heads:
        k_heads = text.get("linear_num_key_heads") or v_heads
        k_dim, v_dim = text.get("linear_key_head_dim") or 0, text.get("linear_value_head_dim") or 0
        kernel = text.get("linear_conv_kernel_dim") or 4
        state = 3 * 4 * v_heads * k_dim * v_dim + 2 * per * (2 * k_heads * k_dim + v_heads * v_dim) * (piece + kernel)
    return length * per_token + scores + state


def piece_room(available: int, length: int, cfg, forward_per_token: int, per: int,
               sequence_per_token: int = 0) -> int:
    """The largest piece (a multiple of PIECE_ALIGN where that fits) whose activations and the
    sequence's terms (``piece_sequence_bytes``) fit ``available`` bytes; 0 when not even one token."""
    def need(p: int) -> int:
        return (chunk_bytes(p, forward_per_token, cfg.hidden_size, per, sequence_per_token)
                + piece_sequence_bytes(cfg, length, p, per))

    lo, hi = 0, length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= available else (lo, mid - 1)
    return lo - lo % PIECE_ALIGN if lo >= PIECE_ALIGN else lo


def tensor_transient_bytes(probe_ckpt) -> int:
    """One decoder-layer tensor's load transient: the largest one's elements in float32, twice (the
    dequantizer's temporaries; a stored BF16 tensor needs less)."""
    largest = 0
    for g in probe_ckpt.inventory.groups:
        if g.layer is not None and g.mtp_layer is None:
            largest = max(largest, g.params // max(1, g.tensors))
    return 2 * 4 * largest
