"""vLLM 0.34.0's own source files, for the tests that check a rule's premise against the engine's code.

The files come from tests/locks/vllm-0.34.0-src.lock: tests/engine_envs.py downloads that one wheel by its
sha256 once per machine and keeps its ``vllm/**/*.py`` files (the ``vllm`` package is never imported). Where
the package index cannot be reached the tests that need them skip, saying so; every other machine, CI
included, runs them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

import engine_envs
from sglang_parser import announce


@lru_cache(maxsize=1)
def _root() -> "Path | str":
    """The unpacked ``vllm/`` folder, or why there is none (asked once per process: an unreachable index
    costs one attempt, not one per test)."""
    try:
        engine_envs.ensure(engine_envs.VLLM_034_SRC, announce)
    except engine_envs.EngineEnvUnavailable as exc:
        return str(exc)
    return engine_envs.source_root(engine_envs.VLLM_034_SRC) / "vllm"


def vllm_034() -> Path:
    """vLLM 0.34.0's ``vllm/`` source folder; skips the test when the package index could not give it."""
    root = _root()
    if isinstance(root, str):
        pytest.skip(f"vLLM 0.34.0's source is not available on this machine ({root}); the engine-source "
                    "tests download its wheel once by tests/locks/vllm-0.34.0-src.lock and need the package "
                    "index for that")
    return root


def vllm_034_text(*parts: str) -> str:
    """One vLLM 0.34.0 source file's text, named by its path parts under ``vllm/``."""
    path = vllm_034().joinpath(*parts)
    if not path.is_file():  # the lock's wheel lacks it: the premise itself is gone, a failure
        raise AssertionError(f"vLLM 0.34.0 has no {'/'.join(parts)} (tests/locks/vllm-0.34.0-src.lock)")
    return path.read_text(encoding="utf-8")
