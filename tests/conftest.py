"""Shared test fixtures: generated checkpoints (never committed) and a CLI runner.

Generated checkpoints come from fixtures/generate.py (real names, dtypes and shape relations,
tiny dims) and are built once per test session into a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fixtures.generate import FIXTURES, build_fixture  # noqa: E402

# The Hub header cache (sources/header_cache.py) is off for the test session, so no test writes into the
# user's ~/.cache/ckptinspect and no test reads a header another test's server stored; the tests of the
# Hub source turn it on with a directory of their own (hub_repos.isolate_hf).
os.environ["CKPTINSPECT_HEADER_CACHE"] = "0"
# The caches' MAC key (ckptinspect/cache_auth.py) of the test session: never the user's own config folder.
os.environ.setdefault("CKPTINSPECT_CACHE_KEY_FILE",
                      os.path.join(tempfile.mkdtemp(prefix="ckptinspect-test-config-"), "cache-key"))

PYTEST_CONFIG: pytest.Config | None = None  # for tests/sglang_parser.py's one-line install notice
_BACKGROUND_INSTALL = None  # the engine installer started by this process (tests/engine_envs.py)

# Tests that run an engine's own code: a module that imports one of these helpers needs an engine
# environment (tests/engine_envs.py). They run last, so the engines install while the rest of the suite runs.
ENGINE_HELPERS = frozenset({"sglang_parser", "sglang_memory", "sglang_quant_oracle", "vllm_engine",
                            "vllm_quant_oracle", "engine_envs", "vllm_source"})


def pytest_configure(config: pytest.Config) -> None:
    global PYTEST_CONFIG
    PYTEST_CONFIG = config


def _needs_engine(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    # a helper module imported whole, or a name imported from one (its __module__ says where it lives)
    return module is not None and any(
        str(getattr(value, "__name__", "") if isinstance(value, type(os)) else getattr(value, "__module__", "") or "")
        .rpartition(".")[2] in ENGINE_HELPERS for value in vars(module).values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine tests last (a stable sort keeps every file's order), and their environments installing now."""
    global _BACKGROUND_INSTALL
    needs = [_needs_engine(item) for item in items]  # asked once per item: it walks the module's names
    if not any(needs):
        return
    items[:] = [item for item, n in zip(items, needs) if not n] + [item for item, n in zip(items, needs) if n]
    if config.getoption("collectonly"):
        return
    import engine_envs
    from sglang_parser import announce

    _BACKGROUND_INSTALL = engine_envs.start_background_install(announce)


def pytest_unconfigure(config: pytest.Config) -> None:
    """An installer still running when the session ends (no engine test needed it) is stopped; the
    unfinished environment has no marker, so the next run installs it again from the start."""
    if _BACKGROUND_INSTALL is not None and _BACKGROUND_INSTALL.poll() is None:
        import signal

        os.killpg(_BACKGROUND_INSTALL.pid, signal.SIGTERM)
        _BACKGROUND_INSTALL.wait(timeout=60)


@pytest.fixture(scope="session")
def report(make_fixture: Callable[[str], Path]) -> Callable[[str], object]:
    """name -> the real pipeline's Report of a generated fixture, built once per session (records are
    frozen, so tests share them)."""
    from ckptinspect.pipeline import build_report

    cache: dict[str, object] = {}

    def get(name: str) -> object:
        if name not in cache:
            cache[name] = build_report(str(make_fixture(name)), progress=False)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def make_fixture(fixture_root: Path) -> Callable[[str], Path]:
    """name -> directory of the generated fixture checkpoint (built once per session)."""
    built: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in built:
            built[name] = build_fixture(name, fixture_root)
        return built[name]

    return make


@pytest.fixture(scope="session")
def qwen35_replica(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full-scale nvidia/Qwen3.5-397B-A17B-NVFP4 layout: 94 sparse shards, ~371k tensors (~6-10 s)."""
    from fixtures.replica import build_replica

    return build_replica(tmp_path_factory.mktemp("replica"))


@pytest.fixture(scope="session")
def qwen35_report(qwen35_replica: Path):
    """The real pipeline's Report on the full-scale replica (shared by report and plan tests)."""
    from ckptinspect.pipeline import build_report

    return build_report(str(qwen35_replica), progress=False)


@pytest.fixture(scope="session")
def fixture_specs() -> dict:
    return FIXTURES


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m ckptinspect ARGS`` as a user would (separate process, real exit code)."""
    full_env = dict(os.environ)
    full_env.pop("CKPTINSPECT_DEBUG", None)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=str(ROOT))


@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess]:
    return run_cli


def report_json(path: Path | str, *extra: str) -> dict:
    """`report --format json` through the real CLI, validated against the shipped schema."""
    from ckptinspect.render.json_out import validate_report_json

    result = run_cli("report", str(path), "--format", "json", "--quiet", *extra)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    validate_report_json(doc)
    return doc
