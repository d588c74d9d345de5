"""DeepSeek-V3 / GLM-4.x MTP head through transformers' own ``MtpModel`` (modeling_layers.py).

transformers derives the MTP weight regex from the main class's ``_keys_to_ignore_on_load_unexpected``
and keeps only patterns whose first index is >= num_hidden_layers; DeepSeek-V3 hard-codes
``model\\.layers\\.61.*`` (transformers 5.17 / 5.24 ``modeling_deepseek_v3.py``), so a model of another
depth would find nothing. We set the pattern from the real num_hidden_layers on the instance.
"""

from __future__ import annotations

import torch
from torch import nn

from ckptinspect.errors import ProbeError
from ckptinspect.probe.heads.base import MtpHead


class TransformersMtpHead(MtpHead):
    def __init__(self, main_model: nn.Module, mtp_model: nn.Module, *, family: str) -> None:
        super().__init__(main_model)
        self.family = family
        self.mtp = mtp_model
        self.mtp.eval()

    @classmethod
    def load(cls, main_model: nn.Module, model_dir: str, *, family: str) -> "TransformersMtpHead":
        from transformers.modeling_layers import MtpModel

        text_cfg = main_model.config.get_text_config()
        num_layers = int(text_cfg.num_hidden_layers)
        if not getattr(text_cfg, "num_mtp_layers", 0):
            raise ProbeError("config declares no MTP layer (num_nextn_predict_layers is 0 or absent)",
                             path=model_dir)
        main_model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{num_layers}\..*"]
        main_model.config.name_or_path = model_dir
        device = next(main_model.get_decoder().norm.parameters()).device  # resident also when streaming
        try:
            mtp = MtpModel.from_pretrained(main_model, device_map={"": device})
        except (RuntimeError, ValueError) as exc:
            raise ProbeError(f"transformers MtpModel could not load the MTP layer: {exc}", path=model_dir) from exc
        return cls(main_model, mtp, family=family)

    @classmethod
    def fresh(cls, main_model: nn.Module, *, family: str) -> "TransformersMtpHead":
        """A randomly initialised MTP layer (fixture training and tests)."""
        from transformers.modeling_layers import MtpModel

        import torch

        # MtpModel's post_init re-initializes every submodule it holds, the main model's shared
        # embedding and LM head included: keep their values (they may already be loaded).
        shared = [(p, p.detach().clone()) for m in (main_model.get_input_embeddings(),
                                                    main_model.get_output_embeddings()) for p in m.parameters()]
        mtp = MtpModel(main_model, 1)
        with torch.no_grad():
            for param, value in shared:
                param.copy_(value)
        # Fused expert parameters start as torch.empty memory; initialise the MTP layers (not the shared
        # embedding / head) the way the main model's class does.
        with torch.no_grad():
            for module in mtp.layers.modules():
                main_model._init_weights(module)
        return cls(main_model, mtp, family=family)

    @classmethod
    def from_tensors(cls, main_model: nn.Module, tensors, *, family: str, source: str) -> "TransformersMtpHead":
        """The MTP layer from checkpoint tensors (names without the ``model.layers.{L}.`` prefix),
        for when transformers cannot load it itself (streamed or remote main model): the DeepSeek-V3
        checkpoint layout -> ``MtpLayer`` (enorm / hnorm / eh_proj, ``shared_head.norm`` -> post_norm,
        the rest -> mtp_block, per-expert tensors fused)."""
        from ckptinspect.probe.heads.fusion import fuse_expert_tensors

        ref = next(main_model.get_decoder().norm.parameters())
        head = cls.fresh(main_model, family=family)
        layer = head.mtp.layers[0]
        state: dict[str, torch.Tensor] = {}
        block_in = {}
        for name, t in tensors.items():
            if name.split(".")[0] in ("enorm", "hnorm", "eh_proj"):
                state[name] = t
            elif name.startswith("shared_head.norm."):
                state["post_norm." + name[len("shared_head.norm."):]] = t
            elif not name.startswith(("shared_head.head", "embed_tokens")):
                block_in[name] = t
        expected = set(layer.mtp_block.state_dict())
        state.update({"mtp_block." + k: v for k, v in fuse_expert_tensors(block_in, expected).items() if k in expected})
        missing = sorted(set(layer.state_dict()) - set(state))
        if missing:
            raise ProbeError(f"MTP layer is missing {', '.join(missing[:5])}", path=source)
        layer.load_state_dict({k: v.to(ref.dtype) for k, v in state.items()})
        head.to(ref.device)
        return head

    def rotary(self, x: torch.Tensor, position_ids: torch.Tensor):
        return None if self.mtp.rotary_emb is None else self.mtp.rotary_emb(x, position_ids.to(x.device))

    def step(self, emb, hidden, position_ids, mask):
        layer = self.mtp.layers[0]
        # Positional call: the cache argument is `cache` in transformers 5.24, `past_key_values` in 5.17.
        out = layer(emb, hidden, self.rotary(emb, position_ids), mask, position_ids, None)
        if getattr(self.mtp, "use_shared_post_norm", False):
            out = self.mtp.shared_post_norm(out)
        return out

    def logits(self, out_hidden):
        head = self.main.get_output_embeddings()
        return self.mtp._project_to_logits(out_hidden.to(head.weight.device))
