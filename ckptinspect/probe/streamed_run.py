"""Teacher mode over a layer-streamed main model (``stream.py``): one pass over the decoder layers for
every probe token, then the MTP chain and the walk per batch on the stored hidden states."""

from __future__ import annotations

import time

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader
from ckptinspect.probe.evaluate import Sequence


def hf_config(model_dir: str, config: dict, spec, trust_remote_code: bool):
    from transformers import AutoConfig, CONFIG_MAPPING

    if spec.main_model_type:  # same rule as loader.load_main_model: a built-in class, no remote code
        return CONFIG_MAPPING[spec.main_model_type](**{k: v for k, v in config.items()
                                                       if k not in ("auto_map", "architectures", "model_type")})
    return AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def run_streamed(model_dir: str, probe_ckpt, spec, sequences: list[Sequence], tok, *, common: dict, mode: str,
                 device: str, dtype: torch.dtype, batch_size: int, progress: bool, need: int, limit: int,
                 chunk_tokens: int, timings: dict[str, float], trust_remote_code: bool = False,
                 experts_implementation: str = "auto", batch_info: dict | None = None):
    from ckptinspect.probe.result import Streaming, build_result
    from ckptinspect.probe.heads.build import build_head
    from ckptinspect.probe.scoring import score_all, scoring_bytes
    from ckptinspect.probe.stream import StreamedMain, stream_estimate

    cfg = probe_ckpt.checkpoint.config
    t0 = time.perf_counter()
    prefix = spec.concrete_prefix(probe_ckpt.checkpoint.config.num_hidden_layers)
    per = torch.tensor([], dtype=dtype).element_size()
    mtp_bytes = loader.logical_params(probe_ckpt.metas, lambda n: n.startswith(prefix)) * per
    tokens = len(sequences) * max(len(s.tokens) for s in sequences)  # padded rows
    scratch = scoring_bytes(min(batch_size, len(sequences)), max(len(s.tokens) for s in sequences),
                            cfg.vocab_size or 0, cfg.hidden_size, common["steps"], dtype, cfg.num_attention_heads or 0)
    estimate = dict(stream_estimate(probe_ckpt, dtype, tokens, mtp_bytes, scratch))
    if estimate["total"] > limit:
        raise ProbeError(f"even layer-streamed the probe needs about {estimate['total'] / 2**30:.1f} GiB "
                         f"(one layer {estimate['layer'] / 2**31:.1f} GiB, resident {estimate['resident'] / 2**30:.1f}"
                         f" GiB, activations {estimate['activations'] / 2**30:.1f} GiB) but {limit / 2**30:.1f} GiB "
                         "is available; use fewer prompts / a shorter corpus, or --main-url", path=model_dir)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    config = hf_config(model_dir, dict(probe_ckpt.checkpoint.config.raw), spec, trust_remote_code)
    streamed = StreamedMain(model_dir, probe_ckpt, config, dtype=dtype, device=device, chunk_tokens=chunk_tokens)
    main = streamed.model
    experts = loader.set_experts_implementation(main, experts_implementation, decode_on_gpu=False)
    head = build_head(spec, main, model_dir, model_dir, probe_ckpt.metas)
    timings["load"] = time.perf_counter() - t0
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(len(s.tokens) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    for i, s in enumerate(sequences):  # right padding: causal attention never looks at it
        ids[i, : len(s.tokens)] = torch.tensor(s.tokens)
    t0 = time.perf_counter()
    hidden = streamed.hidden(ids)
    timings["hidden_forward"] = time.perf_counter() - t0

    def hidden_for(indices, n):
        return hidden[torch.tensor(indices, device=hidden.device), :n]

    first_device = next(main.get_decoder().norm.parameters()).device
    tallies = score_all(main, head, sequences, common["steps"], mode=mode, temperature=common["temperature"],
                        batch_size=batch_size, pad_id=pad, device=first_device, progress=progress,
                        timings=timings, hidden_for=hidden_for)
    peak = int(torch.cuda.max_memory_allocated(device)) if device.startswith("cuda") else None
    streaming = Streaming(streamed.stats, estimate, limit, need, peak)
    return build_result(**common, mode=mode, tallies=tallies, devices=[device],
                        dtype=str(dtype).replace("torch.", ""), main_source="layer-streamed transformers",
                        dequantized=any(loader.quant_kind(n, probe_ckpt.metas) in loader.DEQUANTIZERS
                                        for n in probe_ckpt.metas),
                        timings=timings, streaming=streaming,
                        extra={"tokens_scored": sum(len(s.tokens) for s in sequences), **(batch_info or {}),
                               "experts_implementation": experts})
