"""``--main-url``: the main model runs in an SGLang server, the MTP layer runs locally.

Protocol (SGLang 0.5.x native API, server started with ``--enable-return-hidden-states``):
``POST /generate`` with ``{"input_ids": [...], "sampling_params": {"temperature": 0, "max_new_tokens": N},
"return_hidden_states": true}`` returns ``{"output_ids": [...], "meta_info": {"hidden_states": [...]}}``
where ``hidden_states[0]`` holds the prompt's rows ([P, H]) and each further entry one decode step's
row ([H]) (`srt/managers/scheduler_output_processor_mixin.py`; SGLang test `test_hidden_states.py`).
Those are the post-final-norm states the logits processor saw (mtp_families.md §5.1). Locally we
only need the embedding, the lm_head and the MTP layer: a one-decoder-layer shell of the main
model carries them (its decoder layer is never run).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader
from ckptinspect.probe.evaluate import Sequence, score_batch
from ckptinspect.probe.metrics import Tally


# A reply holds the hidden-state rows of prompt and answer: tokens x hidden size floats as JSON text, ~10
# bytes each (600 tokens x 7,168 = 4.3M values, ~45 MB). The caps allow ~1,800 rows of a 7,168-wide model
# and keep the probe's memory bounded whatever a server sends.
MAX_REPLY_BYTES = 128 << 20
MAX_REPLY_VALUES = 16_000_000


def post_json(url: str, payload: dict[str, Any], client: Any = None) -> dict[str, Any]:
    """POST ``payload`` to the main-model server through the one bounded network client
    (sources/hub_session.py ServerClient: the command's deadline, byte budget, body cap, bounded JSON,
    the URL's password never shown); ``client``: one for the whole run (one byte budget), else a new one."""
    from ckptinspect.sources.hub_session import ServerClient

    base, _, path = url.partition("/generate")
    client = client or ServerClient(base, "main-model server")
    reply = client.post_json("/generate" + path, payload, MAX_REPLY_BYTES, max_items=MAX_REPLY_VALUES)
    if not isinstance(reply, dict):
        raise ProbeError("the main-model server's reply is not a JSON object", path=client.shown)
    return reply


def output_ids(reply: dict[str, Any], eos: set[int], url: str) -> list[int]:
    """The reply's generated token ids, cut after the first end-of-sequence token."""
    out = reply.get("output_ids", [])
    if not isinstance(out, list) or not all(type(t) is int and 0 <= t < 2 ** 31 for t in out):
        raise ProbeError("the reply's output_ids is not a list of token ids", path=url)
    out = list(out)
    for c, t in enumerate(out):
        if t in eos:
            return out[: c + 1]
    return out


def hidden_rows(meta: Any, url: str) -> torch.Tensor:
    """The reply's ``meta_info.hidden_states`` as one [rows, hidden] float32 tensor of finite numbers."""
    # meta_info is whatever JSON the server sent: a list or a string has no .get (was an AttributeError)
    hs = meta.get("hidden_states") if isinstance(meta, dict) else None
    if not hs:
        raise ProbeError("reply has no meta_info.hidden_states (start SGLang with --enable-return-hidden-states)",
                         path=url)
    rows = []
    try:
        for item in hs:
            t = torch.tensor(item, dtype=torch.float32)
            rows.append(t[None] if t.dim() == 1 else t)
        out = torch.cat(rows, dim=0)
    except (TypeError, ValueError, RuntimeError, IndexError, OverflowError):
        # ragged, non-numeric, rows of other widths, or an integer past any float (JSON allows 5,000 digits)
        out = None
    # Rows must be 2-D and non-empty (run_remote reads shape[1]; [] or [[[x]]] rows were an IndexError or a
    # wrong-rank tensor there), and finite as float32: JSON numbers past 3.4e38 become inf here, after
    # decode_answer's NaN / Infinity check, and an inf row gives NaN logits that pass every later check.
    if out is None or out.dim() != 2 or out.shape[1] == 0 or not bool(torch.isfinite(out).all()):
        raise ProbeError("the reply's meta_info.hidden_states is not a list of equal-width rows of finite "
                         "float32 numbers", path=url)
    return out


def check_next_tokens(main, hidden: torch.Tensor, next_tokens: list[int], url: str) -> None:
    """The server's hidden state at each generated position must give the token it emitted there:
    argmax(lm_head(h_t)) == token t+1. Otherwise the rows are not the post-norm states the logits
    processor saw (another layer, pre-norm, shifted by one), and every draft scored on them would be
    wrong. A tie within float rounding (the server's lm_head runs in its own dtype and kernels) is
    accepted: the emitted token's logit may trail the maximum by 1e-3 of the largest |logit| + 1e-3."""
    if not next_tokens:
        return
    with torch.no_grad():
        logits = main.get_output_embeddings()(hidden).float()
    target = torch.tensor(next_tokens, device=logits.device)
    top = logits.max(dim=-1).values
    emitted = logits.gather(-1, target[:, None])[:, 0]
    slack = 1e-3 * logits.abs().max(dim=-1).values + 1e-3
    bad = torch.nonzero(emitted < top - slack).flatten().tolist()
    if bad:
        i = bad[0]
        raise ProbeError(f"the server's hidden states do not give its own tokens: argmax(lm_head(h)) != next token "
                         f"at {len(bad)} of {len(next_tokens)} generated positions (first: position {i}, emitted "
                         f"{next_tokens[i]}, lm_head says {int(logits[i].argmax())}); they are not the post-norm "
                         "last-layer states of this checkpoint (wrong layer, pre-norm, shifted, or another model)",
                         path=url)


def load_shell(model_dir: str, config: dict[str, Any], spec, dtype: torch.dtype, device: str, metas):
    """Main-model class with one decoder layer; embedding, final norm and lm_head loaded from the checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM, CONFIG_MAPPING

    if spec.main_model_type:
        cfg = CONFIG_MAPPING[spec.main_model_type](**{k: v for k, v in config.items()
                                                       if k not in ("auto_map", "architectures", "model_type")})
    else:
        cfg = AutoConfig.from_pretrained(model_dir)
    text = cfg.get_text_config()
    num_layers = int(text.num_hidden_layers)
    shell_cfg = copy.deepcopy(cfg)
    shell_text = shell_cfg.get_text_config()
    shell_text.num_hidden_layers = 1
    if getattr(shell_text, "layer_types", None):
        shell_text.layer_types = ["full_attention"]
    main = AutoModelForCausalLM.from_config(shell_cfg, dtype=dtype)
    wanted = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"}
    tensors = dict(loader.iter_tensors(model_dir, metas, lambda n: n in wanted, dtype))
    main.get_input_embeddings().weight.data.copy_(tensors["model.embed_tokens.weight"])
    if "lm_head.weight" in tensors:
        main.get_output_embeddings().weight.data.copy_(tensors["lm_head.weight"])
    return main.to(device).eval(), num_layers


def build_remote_head(spec, main, model_dir: str, num_layers: int, metas):
    from ckptinspect.probe.heads.fusion import FusionHead
    from ckptinspect.probe.heads.transformers_mtp import TransformersMtpHead

    prefix = spec.concrete_prefix(num_layers)
    ref = next(main.parameters())
    tensors = {n[len(prefix):]: t for n, t in loader.iter_tensors(model_dir, metas, lambda n: n.startswith(prefix), ref.dtype)}
    if spec.kind != "transformers":
        return FusionHead(main, spec, tensors, source=model_dir)
    return TransformersMtpHead.from_tensors(main, tensors, family=spec.id, source=model_dir).to(dtype=ref.dtype)


def run_remote(url: str, *, model_dir, config, probe_ckpt, spec, prompts, steps, max_new_tokens, gpu, readiness,
               device, dtype, started, ref, batch_size, progress, temperature, efficiency, settings=None):
    from tqdm import tqdm

    from ckptinspect.probe.result import build_result
    from ckptinspect.probe.prompts import encode_prompt, load_tokenizer

    base = url.rstrip("/")
    metas = probe_ckpt.metas
    tok = load_tokenizer(model_dir, probe_ckpt.checkpoint.config.vocab_size, trust_remote_code=False)
    main, num_layers = load_shell(model_dir, config, spec, dtype, device, metas)
    head = build_remote_head(spec, main, model_dir, num_layers, metas)
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    tallies: dict[str, Tally] = {}
    from ckptinspect.sources.hub_session import ServerClient

    from ckptinspect.settings import DEFAULTS

    # the run's requests: one byte budget, the command's deadline (api.probe read the settings at the edge)
    client = ServerClient(base, "main-model server", settings if settings is not None else DEFAULTS)
    base = client.shown  # what messages and the result name: never the URL's password
    for prompt in tqdm(prompts, desc="remote generate+mtp", unit="prompt", disable=not progress):
        ids = encode_prompt(tok, prompt, chat=True, vocab_size=probe_ckpt.checkpoint.config.vocab_size, source=model_dir)
        reply = post_json(f"{client.base}/generate", {"input_ids": ids, "return_hidden_states": True,
                                                      "sampling_params": {"temperature": 0,
                                                                          "max_new_tokens": max_new_tokens}},
                          client=client)
        out = output_ids(reply, eos, base)
        tokens = ids + out
        rows = hidden_rows(reply.get("meta_info", {}), base)
        if rows.shape[0] < len(tokens) - 1:
            raise ProbeError(f"server returned {rows.shape[0]} hidden rows for {len(tokens)} tokens", path=base)
        hidden = torch.zeros(1, len(tokens), rows.shape[1], dtype=dtype, device=device)
        hidden[0, : len(tokens) - 1] = rows[: len(tokens) - 1].to(dtype)
        check_next_tokens(main, hidden[0, len(ids) - 1: len(tokens) - 1], tokens[len(ids):], base)
        seq = Sequence(prompt.category, tuple(tokens), len(ids))
        pad = tok.pad_token_id or 0
        for cat, t in score_batch(main, head, [seq], steps, mode="greedy", temperature=temperature, pad_id=pad,
                                  device=device, hidden=hidden, with_target=False).items():
            tallies.setdefault(cat, Tally(steps)).merge(t)
    return build_result(ref=ref, probe_ckpt=probe_ckpt, spec=spec, mode="greedy",
                        steps=steps, temperature=temperature, gpu=gpu, tallies=tallies, readiness=readiness,
                        devices=[device], dtype=str(dtype).replace("torch.", ""), started=started,
                        max_new_tokens=max_new_tokens, main_source=f"SGLang-compatible server {base}",
                        dequantized=False, efficiency=efficiency)
