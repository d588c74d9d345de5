"""The interface every MTP head implements (one MTP layer, reused for every draft depth)."""

from __future__ import annotations

import torch
from torch import nn


class MtpHead(nn.Module):
    """One MTP layer wired to the main model's embedding and lm_head.

    ``step`` runs the layer once over a whole (possibly multi-stream) sequence: ``emb`` are the
    embeddings of the tokens fed at each position, ``hidden`` the hidden state recycled into it
    (the target's post-final-norm hidden at depth 1, the layer's own output at depth >= 2, as
    SGLang's single-layer EAGLE worker does: `srt/speculative/eagle_worker_v2.py` ``draft_forward``),
    ``mask`` an additive 4-D attention mask. It returns the output hidden that is both projected to
    logits and recycled into the next depth.
    """

    family: str = ""

    def __init__(self, main_model: nn.Module) -> None:
        super().__init__()
        # Keep the main model out of this module's parameters (it is shared, not owned).
        object.__setattr__(self, "_main", main_model)

    @property
    def main(self) -> nn.Module:
        return self._main  # type: ignore[attr-defined]

    @property
    def device(self) -> torch.device:
        """Where the MTP layer runs. With --devices the main model is split over GPUs (embedding on the
        first, last layers and head on the last), so inputs and outputs are moved explicitly."""
        own = next(self.parameters(), None)
        if own is None:
            own = next(self.main.get_decoder().layers[-1].parameters())
        return own.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.main.get_input_embeddings()
        return table(ids.to(table.weight.device)).to(self.device)

    def rotary(self, x: torch.Tensor, position_ids: torch.Tensor):
        rotary = getattr(self.main.get_decoder(), "rotary_emb", None)
        if rotary is None:
            return None
        if hasattr(rotary, "mrope_section") and position_ids.dim() == 2:
            # multimodal RoPE (Qwen3.5): text positions repeated on the 3 grid axes; transformers 5.17
            # requires the (3, B, S) form, 5.24 expands a (B, S) one itself.
            position_ids = position_ids[None].expand(3, -1, -1)
        buffer = next(rotary.buffers(), None)
        where = buffer.device if buffer is not None else x.device
        cos, sin = rotary(x.to(where), position_ids.to(where))
        return cos.to(x.device), sin.to(x.device)

    def step(self, emb: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def logits(self, out_hidden: torch.Tensor) -> torch.Tensor:
        head = self.main.get_output_embeddings()
        return head(out_hidden.to(head.weight.device))
