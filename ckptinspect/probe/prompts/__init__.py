"""Prompt sets: the built-in one (``builtin.jsonl``, written for this project) or a user file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ckptinspect.errors import ProbeError
from ckptinspect.guarded_file import (MAX_PROMPTS_BYTES, MAX_TEMPLATE_BYTES, MAX_TOKENIZER_BYTES, read_bytes,
                                      read_json, read_text)
from ckptinspect.json_text import decode_json
from ckptinspect.records import TOKENIZER_FILES, has_tokenizer


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
    lines = read_text(path, what="prompts file", cap=MAX_PROMPTS_BYTES, error=ProbeError).splitlines()
    prompts: list[Prompt] = []
    if path.endswith(".jsonl"):
        for no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            # the bounded decoder (json_text.py): deep nesting or a 10,000-digit number is one error line
            obj = decode_json(line, source=path, error=ProbeError, what=f"line {no} is not JSON:")
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


# TOKENIZER_FILES (records.py): files one of which a Hugging Face tokenizer is built from
# (tokenizer_config.json alone names a class but holds no vocabulary: the empty tokenizer it yields is
# caught by encode_prompt); one list, which a report's probe hint reads too.

def load_tokenizer(model_dir: str, vocab_size: int | None, *, trust_remote_code: bool):
    import os

    from transformers import AutoTokenizer

    names = os.listdir(model_dir)
    if not has_tokenizer(names):
        raise ProbeError(f"no tokenizer in the checkpoint (none of {', '.join(TOKENIZER_FILES)}): the probe "
                         "needs the model's own tokenizer", path=model_dir)
    check_tokenizer_files(model_dir, names)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"no usable tokenizer ({exc})", path=model_dir) from exc
    check_chat_template_bounded(tok, model_dir)
    tok.probe_vocab_size = vocab_size
    return tok


# A chat template is the checkpoint's code (Jinja). transformers renders it in a sandbox that bounds
# range() but not the work or the memory of a render: nested loops of 10^10 steps, or ``'x' * 10**10``,
# exhaust memory before any error line. So the template is first rendered once in a child process
# under an address-space limit and a time limit; the real render (in process, unchanged) follows only
# when that one ends well. Real templates render in milliseconds in well under 100 MiB.
TEMPLATE_CHECK_MEMORY_BYTES = 1024 * 1024 * 1024
TEMPLATE_CHECK_TIMEOUT_S = 30.0
_TEMPLATE_CHILD = r"""
import json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
data = json.loads(sys.stdin.read())
from transformers.utils.chat_template_utils import render_jinja_template
try:
    out, _ = render_jinja_template(conversations=[[{"role": "user", "content": "Hello"}]],
                                   chat_template=data["template"], add_generation_prompt=True, **data["kwargs"])
    print(json.dumps({"ok": len(out[0])}))
except MemoryError:
    print(json.dumps({"problem": "exhausts memory"}))
except BaseException as exc:
    print(json.dumps({"ok": -1, "error": type(exc).__name__}))
"""


def check_chat_template_bounded(tok, source: str) -> None:
    """ProbeError when rendering the tokenizer's chat template(s) for one short message exceeds
    ``TEMPLATE_CHECK_MEMORY_BYTES`` or ``TEMPLATE_CHECK_TIMEOUT_S`` (a template that merely fails is
    left to encode_prompt, which words its error)."""
    import resource  # noqa: F401 - the child needs it; POSIX only, like the probe
    import subprocess
    import sys

    templates = getattr(tok, "chat_template", None)
    if isinstance(templates, str):
        templates = [templates]
    elif isinstance(templates, dict):
        templates = [t for t in templates.values() if isinstance(t, str)]
    else:
        return
    special = getattr(tok, "special_tokens_map", {}) or {}
    kwargs = {k: v for k, v in special.items() if isinstance(v, (str, list))}
    for template in templates:
        payload = json.dumps({"template": template, "kwargs": kwargs})
        try:
            proc = subprocess.run([sys.executable, "-c", _TEMPLATE_CHILD, str(TEMPLATE_CHECK_MEMORY_BYTES)],
                                  input=payload, capture_output=True, text=True, timeout=TEMPLATE_CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ProbeError(f"the checkpoint's chat template takes over {TEMPLATE_CHECK_TIMEOUT_S:.0f} s to render "
                             "one short message", path=source) from None
        lines = proc.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if answer.get("problem") or "ok" not in answer:
            raise ProbeError(f"the checkpoint's chat template exhausts the {TEMPLATE_CHECK_MEMORY_BYTES >> 20} MiB "
                             "a render of one short message may use", path=source)


# What transformers reads to build a tokenizer and its chat template, with the cap each gets.
_TOKENIZER_SIDE_FILES = {"tokenizer_config.json": MAX_TEMPLATE_BYTES * 16, "special_tokens_map.json": MAX_TEMPLATE_BYTES,
                         "added_tokens.json": MAX_TOKENIZER_BYTES, "chat_template.json": MAX_TEMPLATE_BYTES,
                         "chat_template.jinja": MAX_TEMPLATE_BYTES}


def check_tokenizer_files(model_dir: str, names: list[str]) -> None:
    """The checks every file the tool reads gets (guarded_file.py), before transformers opens them: a FIFO
    would hang its open(), /dev/zero or a sparse 4 GB file exhaust memory, deep JSON nesting raise
    RecursionError inside the tokenizer library."""
    import os

    for name in names:
        path = os.path.join(model_dir, name)
        if name.endswith(".json") and (name in _TOKENIZER_SIDE_FILES or name in TOKENIZER_FILES):
            read_json(path, what=name, cap=_TOKENIZER_SIDE_FILES.get(name, MAX_TOKENIZER_BYTES), error=ProbeError)
        elif name in _TOKENIZER_SIDE_FILES or name in TOKENIZER_FILES or name.endswith(".tiktoken"):
            read_bytes(path, what=name, cap=_TOKENIZER_SIDE_FILES.get(name, MAX_TOKENIZER_BYTES), error=ProbeError)


def encode_prompt(tok, prompt: Prompt, *, chat: bool, vocab_size: int | None, source: str) -> list[int]:
    """Token ids of ``prompt`` (through the chat template when the tokenizer has one; a prompt given
    as ids is taken as it is), checked: an empty encoding or an id the model's embedding does not
    have is an error, not a crash later."""
    if prompt.ids is not None:
        return check_ids(list(prompt.ids), vocab_size, source, what=f"{prompt.category} prompt")
    if chat and getattr(tok, "chat_template", None):
        try:
            text = tok.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                           add_generation_prompt=True)
        except Exception as exc:  # the template is the checkpoint's code (Jinja): any failure is its own
            raise ProbeError(f"the checkpoint's chat template fails: {type(exc).__name__}: {exc}",
                             path=source) from None
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
    text = read_text(path, what="corpus", cap=MAX_PROMPTS_BYTES, error=ProbeError)
    docs = [d.strip() for d in text.split("\n\n") if d.strip()]
    if not docs:
        raise ProbeError("empty corpus", path=path)
    return [Prompt("corpus", d) for d in docs]
