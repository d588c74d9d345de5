"""The MTP head of the Qwen3-Next / Qwen3.5, MiMo-7B and ERNIE-4.5 families, built from a HeadSpec.

    out = final_norm(block(proj(cat(emb_norm(emb), hidden_norm(h)))))      (hidden_first: cat(h, emb))

The block is one decoder layer of the main model's own class (so Qwen's gated full attention, q/k
norms and MoE are transformers' code), built with ``layer_types = [block_attention]`` because the MTP
block is always full attention even in linear-attention backbones (SGLang `srt/models/qwen3_5_mtp.py`
builds it with full_attention_interval=1). Norms reuse the main model's RMSNorm class, which carries
the family's convention (Qwen3.5/Qwen3-Next: weight + 1, transformers ``Qwen3_5MoeRMSNorm``).
"""

from __future__ import annotations

import contextlib
import copy
import re
from typing import Mapping

import torch
from torch import nn

from ckptinspect.errors import ProbeError
from ckptinspect.probe.heads import HeadSpec
from ckptinspect.probe.heads.base import MtpHead

EXPERT_TENSOR = re.compile(r"^(?P<pre>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def fuse_expert_tensors(tensors: Mapping[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors -> the fused 3-D ``experts.gate_up_proj`` / ``experts.down_proj``.

    Qwen releases ship both layouts (NVIDIA-NeMo/Automodel PR #2778); transformers 5 modules hold the
    fused one, gate rows first then up rows (transformers ``Qwen3_5MoeExperts.forward`` chunks in that order).
    """
    out: dict[str, torch.Tensor] = {}
    per_expert: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, t in tensors.items():
        m = EXPERT_TENSOR.match(name)
        if m and f"{m['pre']}.gate_up_proj" in expected:
            per_expert.setdefault(m["pre"], {}).setdefault(m["proj"], {})[int(m["e"])] = t
        else:
            out[name] = t
    for pre, projs in per_expert.items():
        n = len(projs.get("gate_proj", {}))
        if not (n and len(projs.get("up_proj", {})) == n and len(projs.get("down_proj", {})) == n):
            raise ProbeError(f"MTP experts under {pre} are incomplete (gate/up/down counts differ)")
        out[f"{pre}.gate_up_proj"] = torch.stack(
            [torch.cat([projs["gate_proj"][e], projs["up_proj"][e]], dim=0) for e in range(n)])
        out[f"{pre}.down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)])
    return out


def split_expert_tensors(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inverse of ``fuse_expert_tensors`` for one tensor (fused 3-D -> per-expert 2-D)."""
    if name.endswith("experts.gate_up_proj"):
        pre = name[: -len(".gate_up_proj")]
        half = value.shape[1] // 2
        out = {}
        for e in range(value.shape[0]):
            out[f"{pre}.{e}.gate_proj.weight"] = value[e, :half].contiguous()
            out[f"{pre}.{e}.up_proj.weight"] = value[e, half:].contiguous()
        return out
    if name.endswith("experts.down_proj"):
        pre = name[: -len(".down_proj")]
        return {f"{pre}.{e}.down_proj.weight": value[e].contiguous() for e in range(value.shape[0])}
    return {name: value}


class FusionHead(MtpHead):
    def __init__(self, main_model: nn.Module, spec: HeadSpec, tensors: Mapping[str, torch.Tensor] | None, *,
                 source: str = "checkpoint", bias: bool | None = None) -> None:
        """``tensors``: the MTP layer's tensors with ``spec.prefix`` removed; None keeps a random
        initialisation (fixture training, tests)."""
        super().__init__(main_model)
        self.family = spec.id
        self.spec = spec
        decoder = main_model.get_decoder()
        cfg = copy.deepcopy(main_model.config.get_text_config())
        hidden = int(cfg.hidden_size)
        eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        norm_cls = type(decoder.norm)
        if bias is not None:
            has_bias = bias
        elif spec.proj_bias == "auto":
            has_bias = tensors is not None and f"{spec.proj}.bias" in tensors
        else:
            has_bias = bool(spec.proj_bias)
        if spec.block_attention:
            cfg.layer_types = [spec.block_attention]
        cfg.num_hidden_layers = 1
        # With checkpoint tensors the modules are built on the meta device and take the tensors
        # themselves (load_state_dict assign=True): no random init, no second copy of a 512-expert block.
        with torch.device("meta") if tensors is not None else contextlib.nullcontext():
            self.emb_norm = norm_cls(hidden, eps=eps)
            self.hidden_norm = norm_cls(hidden, eps=eps)
            self.proj = nn.Linear(2 * hidden, hidden, bias=has_bias)
            self.block = type(decoder.layers[-1])(cfg, 0)
            self.final_norm = norm_cls(hidden, eps=eps) if spec.final_norm else None
        # The final norm sits where the last layer runs (device_map splits) and stays resident when
        # the decoder layers are streamed (their parameters are then on the meta device).
        ref = next(decoder.norm.parameters())
        if tensors is not None:
            self._load(tensors, source, ref)
        else:
            self.to(device=ref.device, dtype=ref.dtype)
            # Fused expert parameters are created with torch.empty; initialise everything the way the
            # main model's class does (PreTrainedModel._init_weights) so a fresh head is finite.
            with torch.no_grad():
                for module in self.modules():
                    main_model._init_weights(module)
        self.eval()

    def export(self) -> dict[str, torch.Tensor]:
        """Checkpoint-layout tensors (names without ``spec.prefix``; experts split per expert)."""
        spec = self.spec
        out: dict[str, torch.Tensor] = {}
        names = {"emb_norm": spec.emb_norm, "hidden_norm": spec.hidden_norm, "proj": spec.proj,
                 "final_norm": spec.final_norm}
        for key, value in self.state_dict().items():
            local, _, rest = key.partition(".")
            if local == "block":
                out.update(split_expert_tensors(spec.block + rest, value))
            else:
                out[f"{names[local]}.{rest}"] = value
        return out

    def _load(self, tensors: Mapping[str, torch.Tensor], source: str, ref: torch.Tensor) -> None:
        spec = self.spec
        block_expected = set(self.block.state_dict())
        block_in = {k[len(spec.block):]: v for k, v in tensors.items() if k.startswith(spec.block)}
        block_sd = fuse_expert_tensors(block_in, block_expected)
        state: dict[str, torch.Tensor] = {f"block.{k}": v for k, v in block_sd.items() if k in block_expected}
        names = {"emb_norm": spec.emb_norm, "hidden_norm": spec.hidden_norm, "proj": spec.proj,
                 "final_norm": spec.final_norm}
        for local, ckpt in names.items():
            if not ckpt:
                continue
            for param in ("weight", "bias"):
                if f"{ckpt}.{param}" in tensors:
                    state[f"{local}.{param}"] = tensors[f"{ckpt}.{param}"]
        own = self.state_dict()
        missing = sorted(k for k in own if k not in state)
        if missing:
            shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
            raise ProbeError(f"MTP layer ({spec.id}) is missing tensors for: {shown}", path=source)
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ProbeError(f"MTP tensor for {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}",
                                 path=source)
        self.load_state_dict({k: v.to(device=ref.device, dtype=ref.dtype if v.is_floating_point() else v.dtype)
                              for k, v in state.items()}, strict=True, assign=True)
        left = [n for n, t in list(self.named_parameters()) + list(self.named_buffers()) if t.is_meta]
        if left:
            raise ProbeError(f"MTP layer ({spec.id}): no checkpoint value for {', '.join(left[:4])}", path=source)

    def step(self, emb, hidden, position_ids, mask):
        e = self.emb_norm(emb)
        h = self.hidden_norm(hidden)
        x = self.proj(torch.cat([h, e] if self.spec.hidden_first else [e, h], dim=-1))
        x = self.block(x, attention_mask=mask, position_ids=position_ids,
                       position_embeddings=self.rotary(x, position_ids))
        if isinstance(x, tuple):
            x = x[0]
        return self.final_norm(x) if self.final_norm is not None else x
