"""Layer-streamed main model: for checkpoints larger than the device memory (teacher mode).

The model is built by transformers on the ``meta`` device, so its own forward (masks, positions,
rotary, per-layer attention types) drives the computation; nothing of the decoder is re-implemented.
The embedding, final norm, rotary and LM head stay resident. Each decoder layer's ``forward`` is
replaced on the instance: it reads that layer's tensors from the shards (only the tensors the report's
inventory lists for that layer), dequantizes them on the device with ``dequant.py``, loads them into
the layer with ``load_state_dict(assign=True)`` (no copy), runs every probe token through it in
chunks of whole sequences, and moves the layer back to ``meta`` (freed) before the next one.
Device memory is bounded by one layer + the resident parts + the activations of the probe tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader


@dataclass
class StreamStats:
    layers: int = 0
    bytes_read: int = 0  # stored (quantized) bytes read from the shards for the decoder layers
    read_s: float = 0.0  # reading + dequantizing + loading layer weights
    compute_s: float = 0.0  # running the tokens through the layers
    max_layer_bytes: int = 0  # largest dequantized layer, bytes on the device
    per_layer: list[dict[str, float]] = field(default_factory=list)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _layer_names(inventory, layer: int) -> list[str]:
    return [n for g in inventory.groups if g.layer == layer and g.mtp_layer is None for n in g.names()]


def _local(name: str, layer: int) -> str:
    marker = f"layers.{layer}."
    at = name.find(marker)
    if at < 0:
        raise ProbeError(f"tensor {name!r} of decoder layer {layer} has no '{marker}' in its name")
    return name[at + len(marker):]


def _slice_batch(value: Any, lo: int, hi: int, batch: int) -> Any:
    """Rows lo:hi of every tensor whose first dimension is the batch (masks, hidden states)."""
    if isinstance(value, torch.Tensor):
        return value[lo:hi] if value.dim() and value.shape[0] == batch else value
    if isinstance(value, tuple):
        return tuple(_slice_batch(v, lo, hi, batch) for v in value)
    if isinstance(value, list):
        return [_slice_batch(v, lo, hi, batch) for v in value]
    if isinstance(value, dict):
        return {k: _slice_batch(v, lo, hi, batch) for k, v in value.items()}
    return value


class StreamedMain:
    """The main model with streamed decoder layers; ``model`` is a transformers CausalLM."""

    def __init__(self, model_dir: str, probe_ckpt, hf_config, *, dtype: torch.dtype, device: str,
                 chunk_tokens: int = 32768) -> None:
        from transformers import AutoModelForCausalLM

        from ckptinspect.probe.heads.fusion import fuse_expert_tensors

        self._fuse = fuse_expert_tensors
        self.model_dir, self.metas, self.inventory = model_dir, probe_ckpt.metas, probe_ckpt.inventory
        self.dtype, self.device, self.chunk_tokens = dtype, torch.device(device), chunk_tokens
        # The in-memory path dequantizes into a BF16 copy when computing in FP32 (loader.prepare_loadable_dir);
        # reading at the same precision keeps the two paths' numbers identical.
        self.read_dtype = (torch.bfloat16 if dtype == torch.float32 and loader.needs_dequant(self.metas) else dtype)
        self.stats = StreamStats()
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        self.model = model.eval()
        decoder = model.get_decoder()
        self.layers = decoder.layers
        self._load_resident(decoder)
        for i, layer in enumerate(self.layers):
            layer.forward = self._streamed_forward(i, layer, layer.forward)

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
    def _layer_state(self, index: int, layer) -> dict[str, torch.Tensor]:
        names = _layer_names(self.inventory, index)
        raw = {_local(n, index): t for n, t in
               loader.iter_tensors(self.model_dir, self.metas, set(names).__contains__, self.read_dtype,
                                   device=self.device)}
        expected = set(layer.state_dict())
        state = self._fuse(raw, expected)
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or extra:
            raise ProbeError(f"decoder layer {index}: checkpoint tensors do not match transformers' layer "
                             f"(missing {missing[:3]}, unexpected {extra[:3]})", path=self.model_dir)
        own = layer.state_dict()
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ProbeError(f"decoder layer {index}: {k} has shape {tuple(v.shape)}, transformers expects "
                                 f"{tuple(own[k].shape)}", path=self.model_dir)
        self.stats.bytes_read += sum(self.metas[n].nbytes for n in names)
        return {k: (v.to(own[k].dtype) if v.is_floating_point() else v) for k, v in state.items()}

    def _streamed_forward(self, index: int, layer, original):
        def forward(hidden_states, *args, **kwargs):
            t0 = time.perf_counter()
            layer.load_state_dict(self._layer_state(index, layer), strict=True, assign=True)
            stray = [n for n, b in layer.named_buffers() if b.is_meta]
            if stray:
                raise ProbeError(f"decoder layer {index} has buffers the streamer cannot rebuild: {stray[:3]}")
            _sync(self.device)
            t1 = time.perf_counter()
            layer_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
            batch, seq = hidden_states.shape[0], hidden_states.shape[1]
            rows = max(1, self.chunk_tokens // max(seq, 1))
            outs = []
            for lo in range(0, batch, rows):
                hi = min(batch, lo + rows)
                out = original(hidden_states[lo:hi], *_slice_batch(args, lo, hi, batch),
                               **_slice_batch(kwargs, lo, hi, batch))
                outs.append(out[0] if isinstance(out, tuple) else out)
            result = torch.cat(outs, dim=0) if len(outs) > 1 else outs[0]
            _sync(self.device)
            t2 = time.perf_counter()
            layer.to("meta")  # frees the layer's weights before the next layer is read
            self.stats.layers += 1
            self.stats.read_s += t1 - t0
            self.stats.compute_s += t2 - t1
            self.stats.max_layer_bytes = max(self.stats.max_layer_bytes, layer_bytes)
            self.stats.per_layer.append({"read_s": t1 - t0, "compute_s": t2 - t1})
            return result
        return forward

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Post-final-norm hidden states of ``ids`` [B, N] (one pass over the layers for all rows)."""
        return self.model.get_decoder()(input_ids=ids.to(self.device), use_cache=False).last_hidden_state


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


def stream_estimate(probe_ckpt, dtype: torch.dtype, tokens: int, mtp_bytes: int, scoring: int) -> Mapping[str, int]:
    """Peak device bytes of a streamed run: resident parts + two copies of the largest layer (the
    per-expert tensors and their fused stack coexist while a layer loads) + the MTP layer + the
    residual stream of every probe token (input, output and one temporary) + the scoring scratch of
    one batch (runner.scoring_bytes); the layer and the scoring phases do not overlap."""
    per = torch.tensor([], dtype=dtype).element_size()
    hidden = probe_ckpt.checkpoint.config.hidden_size
    parts = {"resident": resident_bytes(probe_ckpt, dtype), "layer": 2 * largest_layer_bytes(probe_ckpt, dtype),
             "mtp": mtp_bytes, "activations": 3 * tokens * hidden * per, "scoring": scoring}
    parts["total"] = (parts["resident"] + parts["mtp"] + parts["activations"]
                      + max(parts["layer"], parts["scoring"]))
    return parts
