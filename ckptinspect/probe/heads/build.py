"""Build a family's MTP head over a loaded (or streamed) main model."""

from __future__ import annotations

from ckptinspect.probe import loader
from ckptinspect.probe.heads import HeadSpec


def build_head(spec: HeadSpec, main, load_dir: str, source_dir: str | None = None, metas=None):
    """The MTP head. transformers-kind heads load through transformers from ``load_dir`` unless
    ``metas`` is given; every other head reads its tensors with the probe's loader from
    ``source_dir`` (the checkpoint itself, dequantizing on the device; ``metas`` = its inventory)."""
    from ckptinspect.probe.heads.fusion import FusionHead
    from ckptinspect.probe.heads.transformers_mtp import TransformersMtpHead

    if spec.kind == "transformers" and metas is None:
        return TransformersMtpHead.load(main, load_dir, family=spec.id)
    source_dir = source_dir or load_dir
    if metas is None:
        from ckptinspect.probe.checkpoint import open_checkpoint

        metas = open_checkpoint(source_dir).metas
    prefix = spec.concrete_prefix(int(main.config.get_text_config().num_hidden_layers))
    ref = next(main.get_decoder().norm.parameters())
    tensors = {n[len(prefix):]: t for n, t in
               loader.iter_tensors(source_dir, metas, lambda n: n.startswith(prefix), ref.dtype, device=ref.device)}
    if spec.kind == "transformers":
        # fresh() builds the MTP layer at the default dtype: run it at the main model's
        return TransformersMtpHead.from_tensors(main, tensors, family=spec.id, source=source_dir).to(dtype=ref.dtype)
    return FusionHead(main, spec, tensors, source=source_dir)
