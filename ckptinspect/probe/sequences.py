"""The sequences a run scores: greedy continuations of the prompts (generated in batches, savable and
reusable), a user corpus, or the prompt texts (teacher mode)."""

from __future__ import annotations

import json

import torch

from ckptinspect.errors import ProbeError
from ckptinspect.guarded_file import MAX_PROMPTS_BYTES, read_text
from ckptinspect.json_text import decode_json
from ckptinspect.probe.evaluate import Sequence
from ckptinspect.probe.options import GENERATE_MODES
from ckptinspect.probe.prompts import Prompt, check_ids, encode_prompt, load_corpus

CONTINUATIONS_VERSION = 1
# How transformers generates greedy mode's continuations (Settings.probe_generate, CKPTINSPECT_PROBE_GENERATE):
# "eager": its default dynamic KV cache; "static": cache_implementation="static", whose fixed shapes let
# generate compile the decode step (torch.compile, mode "reduce-overhead": CUDA graphs) on a GPU. The same
# greedy tokens either way (tests/test_probe_generate.py); which is faster is measured on the device.
# (GENERATE_MODES: ckptinspect/probe/options.py, which ProbeOptions checks before torch loads)


def _static_refusal(exc: BaseException) -> bool:
    """Errors that mean "this model / transformers / device cannot generate with a static cache or
    compile it", after which the run generates eagerly (and says so); anything else (out of memory,
    an interrupt) is the run's own error."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    return isinstance(exc, (ValueError, TypeError, NotImplementedError, RuntimeError, AttributeError, AssertionError))


@torch.no_grad()
def generate_sequences(main, tok, prompts: list[Prompt], max_new_tokens: int, batch_size: int, device,
                       progress: bool, *, vocab_size: int | None, source: str, generate: str = "eager",
                       info: dict | None = None) -> list[Sequence]:
    """Greedy continuations of ``prompts`` in batches of ``batch_size`` (left padded). ``generate``:
    GENERATE_MODES. ``info`` (the JSON's ``generate`` object) is filled with what ran: ``requested``,
    ``used`` (eager after a refusal of static), ``compiled`` (whether transformers compiled the decode
    step) and ``note`` (why static fell back or ran uncompiled; null when nothing to say)."""
    from tqdm import tqdm

    info = info if info is not None else {}
    info.update({"requested": generate, "used": generate, "compiled": False, "note": None})

    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    eos = main.generation_config.eos_token_id if main.generation_config.eos_token_id is not None else tok.eos_token_id
    eos_set = set(eos if isinstance(eos, list) else [eos]) - {None}
    encoded = [(p, encode_prompt(tok, p, chat=True, vocab_size=vocab_size, source=source)) for p in prompts]
    out: list[Sequence] = []
    for i in tqdm(range(0, len(encoded), batch_size), desc="generate", unit="batch", disable=not progress):
        chunk = encoded[i:i + batch_size]
        width = max(len(ids) for _, ids in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (_, p_ids) in enumerate(chunk):  # left padding for batched generation
            ids[r, width - len(p_ids):] = torch.tensor(p_ids)
            mask[r, width - len(p_ids):] = 1
        kwargs = dict(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                      max_new_tokens=max_new_tokens, pad_token_id=pad)
        gen = None
        if info["used"] == "static":
            try:
                gen = main.generate(**kwargs, cache_implementation="static")
            except Exception as exc:  # noqa: BLE001 - narrowed by _static_refusal; the fallback is recorded
                if not _static_refusal(exc):
                    raise
                # never silent: the JSON's generate.used / note say it, and a warning says it now
                import warnings

                note = f"static KV cache / compile refused ({type(exc).__name__}: {str(exc)[:300]}); generated eagerly"
                warnings.warn(f"probe: {note}", stacklevel=2)
                info.update(used="eager", note=note)
        if gen is None:
            gen = main.generate(**kwargs)
        for r, (prompt, p_ids) in enumerate(chunk):
            cont = gen[r, width:].tolist()
            for c, t in enumerate(cont):
                if t in eos_set:
                    cont = cont[: c + 1]
                    break
            out.append(Sequence(prompt.category, tuple(p_ids + cont), len(p_ids)))
    if info["used"] == "static":
        # transformers compiles the decode step itself (generation/utils.py _valid_auto_compile_criteria) only
        # on a GPU-like device with a compileable cache, and keeps the compiled call on the model
        info["compiled"] = hasattr(main, "_compiled_call")
        if not info["compiled"]:
            info["note"] = (f"static KV cache without compile: transformers compiles the decode step only on a "
                            f"GPU-like device and a compileable cache (device {torch.device(device).type})")
    return out


def save_continuations(path: str, sequences: list[Sequence], *, model_dir: str, max_new_tokens: int) -> None:
    """The main model's greedy continuations, reused by ``--mode teacher --continuations`` runs."""
    from ckptinspect.snapshot_output import refuse_output_in_model_dir

    refuse_output_in_model_dir(model_dir, path, "the --save-continuations file")  # also for library callers
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"ckptinspect_continuations": CONTINUATIONS_VERSION, "model_dir": model_dir,
                             "max_new_tokens": max_new_tokens}) + "\n")
        for s in sequences:
            fh.write(json.dumps({"category": s.category, "prompt_len": s.prompt_len, "tokens": list(s.tokens)}) + "\n")


def load_continuations(path: str, vocab_size: int | None) -> list[Sequence]:
    # The guarded reader (a regular file under the cap, valid UTF-8) and the bounded JSON decoder per line:
    # a FIFO, binary bytes or deep nesting is one error line naming the file.
    text = read_text(path, what="continuations file", cap=MAX_PROMPTS_BYTES, error=ProbeError)
    lines = [decode_json(line, source=path, error=ProbeError, what=f"line {no}: continuations file is not JSON lines:")
             for no, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines or not isinstance(lines[0], dict) \
            or lines[0].get("ckptinspect_continuations") != CONTINUATIONS_VERSION:
        raise ProbeError("not a continuations file written by `ckptinspect probe --save-continuations`", path=path)
    out = []
    for no, row in enumerate(lines[1:], start=2):
        if not isinstance(row, dict):
            raise ProbeError(f"line {no}: not a JSON object", path=path)
        tokens, plen = row.get("tokens"), row.get("prompt_len")
        if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) and isinstance(plen, int)
                and 1 <= plen <= len(tokens)):
            raise ProbeError(f"line {no}: needs integer 'tokens' and 1 <= 'prompt_len' <= len(tokens)", path=path)
        out.append(Sequence(str(row.get("category", "file")), tuple(check_ids(tokens, vocab_size, path,
                                                                               what=f"line {no}")), plen))
    return out


def teacher_sequences(tok, prompt_list: list[Prompt], corpus: str | None, continuations: str | None,
                      vocab: int | None, source: str) -> list[Sequence]:
    """Teacher mode's fixed text: saved greedy continuations (scored from the prompt end, as greedy
    mode does), a user corpus, or the prompt texts themselves; never scored at position 0."""
    if continuations:
        return load_continuations(continuations, vocab)
    docs = load_corpus(corpus) if corpus else prompt_list
    return [Sequence(p.category, tuple(encode_prompt(tok, p, chat=False, vocab_size=vocab, source=source)), 2)
            for p in docs]
