"""``run_probe``: load main model + MTP head, build sequences, score them, project the cost."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence as Seq

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.probe import loader
from ckptinspect.probe.evaluate import Sequence, score_batch
from ckptinspect.probe.heads import HeadSpec, find_spec
from ckptinspect.probe.metrics import Tally
from ckptinspect.probe.prompts import Prompt, load_prompts
from ckptinspect.probe.readiness_gate import check_mtp_usable
from ckptinspect.probe.result import ProbeResult, build_result

MODES = ("greedy", "teacher")


def _device_plan(device: str, devices: Seq[int] | None) -> tuple[Any, list[str], str]:
    """(device_map, device names, primary device)."""
    if devices:
        if not torch.cuda.is_available():
            raise ProbeError("--devices needs CUDA, and torch sees no GPU")
        names = [f"cuda:{d}" for d in devices]
        if len(names) == 1:
            return {"": names[0]}, names, names[0]
        return "auto", names, names[0]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ProbeError(f"--device {device} requested, but torch sees no GPU (use --device cpu)")
    return {"": device}, [device], device


def _free_bytes(names: list[str]) -> int:
    override = os.environ.get("CKPTINSPECT_PROBE_MEMORY_LIMIT")  # bytes; lets tests exercise the check
    if override:
        return int(override)
    if names[0].startswith("cuda"):
        return sum(torch.cuda.mem_get_info(torch.device(n))[0] for n in names)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # non-Linux: no reliable figure, do not block
        return 1 << 62


def estimate_bytes(metas, dtype: torch.dtype) -> int:
    """Weights after dequantization at ``dtype`` + 15% for activations, logits and allocator slack."""
    per = torch.tensor([], dtype=dtype).element_size()
    return int(loader.logical_params(metas) * per * 1.15) + (256 << 20)


def _encode(tok, prompt: Prompt, chat: bool) -> list[int]:
    if chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                       add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(prompt.text)["input_ids"])


@torch.no_grad()
def generate_sequences(main, tok, prompts: list[Prompt], max_new_tokens: int, batch_size: int, device,
                       progress: bool) -> list[Sequence]:
    from tqdm import tqdm

    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    eos = main.generation_config.eos_token_id if main.generation_config.eos_token_id is not None else tok.eos_token_id
    eos_set = set(eos if isinstance(eos, list) else [eos]) - {None}
    encoded = [(p, _encode(tok, p, chat=True)) for p in prompts]
    out: list[Sequence] = []
    for i in tqdm(range(0, len(encoded), batch_size), desc="generate", unit="batch", disable=not progress):
        chunk = encoded[i:i + batch_size]
        width = max(len(ids) for _, ids in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (_, p_ids) in enumerate(chunk):  # left padding for batched generation
            ids[r, width - len(p_ids):] = torch.tensor(p_ids)
            mask[r, width - len(p_ids):] = 1
        gen = main.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                            max_new_tokens=max_new_tokens, pad_token_id=pad)
        for r, (prompt, p_ids) in enumerate(chunk):
            cont = gen[r, width:].tolist()
            for c, t in enumerate(cont):
                if t in eos_set:
                    cont = cont[: c + 1]
                    break
            out.append(Sequence(prompt.category, tuple(p_ids + cont), len(p_ids)))
    return out


def build_head(spec: HeadSpec, main, load_dir: str):
    from ckptinspect.probe.heads.fusion import FusionHead
    from ckptinspect.probe.heads.transformers_mtp import TransformersMtpHead

    if spec.kind == "transformers":
        return TransformersMtpHead.load(main, load_dir, family=spec.id)
    metas = loader.read_headers(load_dir)
    num_layers = int(main.config.get_text_config().num_hidden_layers)
    prefix = spec.concrete_prefix(num_layers)
    ref = next(main.get_decoder().layers[-1].parameters())
    tensors = {n[len(prefix):]: t for n, t in loader.iter_tensors(load_dir, metas, lambda n: n.startswith(prefix), ref.dtype)}
    # ERNIE keeps MTP parts under model.* next to the main model: only the spec's own names count.
    return FusionHead(main, spec, tensors, source=load_dir)


def run_probe(model: str, *, device: str = "cpu", devices: Seq[int] | None = None, prompts: str | None = None,
              max_new_tokens: int = 128, steps: int = 3, mode: str = "greedy", temperature: float = 1.0,
              gpu: str = "H200", trust_remote_code: bool = False, batch_size: int = 8,
              dtype: str | None = None, progress: bool = True, main_url: str | None = None,
              max_prompts: int | None = None, head_factory: Callable | None = None) -> ProbeResult:
    """Measure draft acceptance of ``model``'s MTP head; see docs/probe.md."""
    if mode not in MODES:
        raise ProbeError(f"unknown mode {mode!r} (greedy or teacher)")
    if not 1 <= steps <= 16:
        raise ProbeError("--steps must be between 1 and 16")
    started = time.time()
    model_dir = loader.resolve_model_dir(model)
    config = loader.read_config(model_dir)
    metas = loader.read_headers(model_dir)
    spec = find_spec(config)
    if config.get("auto_map") and not trust_remote_code and not (spec and spec.main_model_type):
        from transformers import CONFIG_MAPPING

        if str(config.get("model_type")) not in CONFIG_MAPPING:
            raise ProbeError("the checkpoint needs remote code (config.json auto_map, model_type "
                             f"{config.get('model_type')!r} unknown to transformers); pass --trust-remote-code to run it",
                             path=model_dir)
    readiness = check_mtp_usable(model, model_dir, config, metas, spec)
    device_map, names, primary = _device_plan(device, devices)
    torch_dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                   "fp32": torch.float32, "float32": torch.float32}.get(dtype or "", None)
    if torch_dtype is None:
        torch_dtype = torch.bfloat16 if primary.startswith("cuda") else torch.float32
    prompt_list = load_prompts(prompts)
    if max_prompts:
        prompt_list = prompt_list[:max_prompts]
    if main_url:  # the main model lives in the server: no in-process memory check
        if mode != "greedy":
            raise ProbeError("--main-url supports --mode greedy only")
        from ckptinspect.probe.server_client import run_remote

        return run_remote(main_url, model_dir=model_dir, config=config, metas=metas, spec=spec, prompts=prompt_list,
                          steps=steps, max_new_tokens=max_new_tokens, gpu=gpu, readiness=readiness,
                          device=primary, dtype=torch_dtype, started=started, ref=model,
                          batch_size=batch_size, progress=progress, temperature=temperature)
    need = estimate_bytes(metas, torch_dtype)
    free = _free_bytes(names)
    if need > free:
        raise ProbeError(f"needs about {need / 2**30:.1f} GiB ({loader.logical_params(metas) / 1e9:.2f} B params at "
                         f"{str(torch_dtype).replace('torch.', '')}) but only {free / 2**30:.1f} GiB is free on "
                         f"{', '.join(names)}; add --devices or use --main-url", path=model_dir)


    load_dir, tmp = loader.prepare_loadable_dir(model_dir, metas, torch_dtype if torch_dtype != torch.float32 else torch.bfloat16, progress)
    try:
        main = loader.load_main_model(load_dir, config, main_model_type=spec.main_model_type, device_map=device_map,
                                      dtype=torch_dtype, trust_remote_code=trust_remote_code)
        head = (head_factory or build_head)(spec, main, load_dir)
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(load_dir, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise ProbeError(f"no usable tokenizer ({exc})", path=model_dir) from exc
    finally:
        if tmp is not None:
            tmp.cleanup()
    first_device = next(main.parameters()).device
    if mode == "greedy":
        sequences = generate_sequences(main, tok, prompt_list, max_new_tokens, batch_size, first_device, progress)
    else:  # teacher: the prompt texts themselves are the corpus; never score position 0
        sequences = [Sequence(p.category, tuple(tok(p.text)["input_ids"]), 2) for p in prompt_list]
    tallies = score_all(main, head, sequences, steps, mode=mode, temperature=temperature, batch_size=batch_size,
                        pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0, device=first_device,
                        progress=progress)
    return build_result(ref=model, model_dir=model_dir, config=config, metas=metas, spec=spec, mode=mode,
                        steps=steps, temperature=temperature, gpu=gpu, tallies=tallies, readiness=readiness,
                        devices=names, dtype=str(torch_dtype).replace("torch.", ""), started=started,
                        max_new_tokens=max_new_tokens, main_source="in-process transformers",
                        dequantized=tmp is not None)


def score_all(main, head, sequences: list[Sequence], steps: int, *, mode: str, temperature: float,
              batch_size: int, pad_id: int, device, progress: bool) -> dict[str, Tally]:
    from tqdm import tqdm

    tallies: dict[str, Tally] = {}
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].tokens))  # less padding per batch
    for i in tqdm(range(0, len(order), batch_size), desc="forward+mtp", unit="batch", disable=not progress):
        batch = [sequences[j] for j in order[i:i + batch_size]]
        for cat, t in score_batch(main, head, batch, steps, mode=mode, temperature=temperature,
                                  pad_id=pad_id, device=device).items():
            tallies.setdefault(cat, Tally(steps)).merge(t)
    return tallies
