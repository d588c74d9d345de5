"""Prompt sets: the built-in one (``builtin.jsonl``, written for this project) or a user file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ckptinspect.errors import ProbeError


@dataclass(frozen=True)
class Prompt:
    category: str
    text: str
    ids: tuple[int, ...] | None = None  # token ids given directly (the synthetic category), not text


def builtin_prompts() -> list[Prompt]:
    text = resources.files(__package__).joinpath("builtin.jsonl").read_text(encoding="utf-8")
    return [Prompt(d["category"], d["prompt"]) for d in map(json.loads, text.splitlines()) if d]


def load_prompts(path: str | None) -> list[Prompt]:
    """``.jsonl``: one object per line with ``prompt`` (or ``text``) and optional ``category``;
    ``.txt``: one prompt per non-empty line (category ``file``)."""
    if path is None:
        return builtin_prompts()
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ProbeError(f"cannot read prompts ({exc.strerror})", path=path) from exc
    prompts: list[Prompt] = []
    if path.endswith(".jsonl"):
        for no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProbeError(f"line {no} is not JSON ({exc.msg})", path=path) from exc
            body = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
            if not isinstance(body, str) or not body:
                raise ProbeError(f"line {no} has no string 'prompt' or 'text'", path=path)
            prompts.append(Prompt(str(obj.get("category", "file")), body))
    elif path.endswith(".txt"):
        prompts = [Prompt("file", line) for line in lines if line.strip()]
    else:
        raise ProbeError("prompts must be a .txt or .jsonl file", path=path)
    if not prompts:
        raise ProbeError("no prompts in file", path=path)
    return prompts


# Files one of which a Hugging Face tokenizer is built from (tokenizer_config.json alone names a
# class but holds no vocabulary: the empty tokenizer it yields is caught by encode_prompt).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


def load_tokenizer(model_dir: str, vocab_size: int | None, *, trust_remote_code: bool):
    import os

    from transformers import AutoTokenizer

    names = os.listdir(model_dir)
    if not any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in names):
        raise ProbeError(f"no tokenizer in the checkpoint (none of {', '.join(TOKENIZER_FILES)}): the probe "
                         "needs the model's own tokenizer", path=model_dir)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"no usable tokenizer ({exc})", path=model_dir) from exc
    tok.probe_vocab_size = vocab_size
    return tok


def encode_prompt(tok, prompt: Prompt, *, chat: bool, vocab_size: int | None, source: str) -> list[int]:
    """Token ids of ``prompt`` (through the chat template when the tokenizer has one; a prompt given
    as ids is taken as it is), checked: an empty encoding or an id the model's embedding does not
    have is an error, not a crash later."""
    if prompt.ids is not None:
        return check_ids(list(prompt.ids), vocab_size, source, what=f"{prompt.category} prompt")
    if chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                       add_generation_prompt=True)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tok(prompt.text)["input_ids"])
    return check_ids(ids, vocab_size, source, what=f"prompt {prompt.text[:40]!r}")


def check_ids(ids: list[int], vocab_size: int | None, source: str, *, what: str) -> list[int]:
    if not ids:
        raise ProbeError(f"the tokenizer encodes {what} to no tokens (a tokenizer without a vocabulary?)",
                         path=source)
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ProbeError(f"the tokenizer gives token id {max(ids)} for {what}, outside the model's vocab_size "
                         f"{vocab_size} (tokenizer and weights do not belong together)", path=source)
    return ids


def load_corpus(path: str) -> list[Prompt]:
    """A teacher-mode corpus: ``.txt`` (the whole file is one document; blank-line separated
    paragraphs are documents) or ``.jsonl`` (``text`` or ``prompt`` per line, optional ``category``)."""
    if path.endswith(".jsonl"):
        return load_prompts(path)
    if not path.endswith(".txt"):
        raise ProbeError("a corpus must be a .txt or .jsonl file", path=path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ProbeError(f"cannot read corpus ({exc.strerror})", path=path) from exc
    docs = [d.strip() for d in text.split("\n\n") if d.strip()]
    if not docs:
        raise ProbeError("empty corpus", path=path)
    return [Prompt("corpus", d) for d in docs]
