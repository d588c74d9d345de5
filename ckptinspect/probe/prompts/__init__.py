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
