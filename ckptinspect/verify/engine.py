"""Run an engine's dry-load script (engine_side/) with the engine's own Python, under a deadline.

The engine is never imported into this process: the script runs in a subprocess of the interpreter of
the environment the engine is installed in, gets the request as JSON on stdin and answers one marked line
on stdout. A missing interpreter, an environment without the engine, a crash or the deadline is one
``EngineEnvError`` line (the CLI's exit 2), never a partial answer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ckptinspect.errors import EngineEnvError

ENGINE_SIDE = Path(__file__).with_name("engine_side")
SCRIPTS = {"vllm": "vllm_dryload.py", "sglang": "sglang_dryload.py"}
PACKAGES = {"vllm": "vllm", "sglang": "sglang"}
ANSWER_MARK = "@@ckptinspect-verify "  # engine_side/_dryload_common.py ANSWER_MARK
EXIT_ENGINE_MISSING, EXIT_INTERNAL = 3, 4  # engine_side/_dryload_common.py
DEFAULT_DEADLINE_S = 300.0


def engine_python(engine: str, given: str | None) -> str:
    """The interpreter to run: ``given``, else this one when the engine is installed next to ckptinspect
    (found without importing it), else an error naming the option."""
    if given is not None:
        path = Path(given)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise EngineEnvError(f"{given}: no executable Python interpreter there", hint="--engine-python")
        return str(path)
    if importlib.util.find_spec(PACKAGES[engine]) is not None:
        return sys.executable
    raise EngineEnvError(f"{engine} is not installed in this Python ({sys.executable})",
                         hint=f"pass --engine-python PATH, the python of the environment {engine} is installed in")


def _engine_env(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def installed_version(engine: str, python: str, *, pythonpath: str | None = None, timeout: float = 60.0) -> str:
    """The engine's version installed for ``python`` (its distribution metadata, without importing the
    engine: well under a second); EngineEnvError when it has none."""
    code = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    try:
        done = subprocess.run([python, "-c", code, PACKAGES[engine]], capture_output=True, text=True,
                              env=_engine_env(pythonpath), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineEnvError(f"{python}: did not say its {engine} version within {timeout:g} s",
                             hint="--engine-python") from None
    except OSError as exc:
        raise EngineEnvError(f"{python}: cannot start it ({exc.strerror or exc})", hint="--engine-python") from None
    version = done.stdout.strip()
    if done.returncode != 0 or not version:
        raise EngineEnvError(f"{python}: {engine} is not installed there",
                             hint=f"pass --engine-python PATH (and --engine-pythonpath DIRS), the environment "
                                  f"{engine} is installed in")
    return version


def start_dryload(engine: str, python: str, *, pythonpath: str | None = None) -> subprocess.Popen:
    """The engine's script, started now: it imports the engine while the caller reads the headers."""
    script = ENGINE_SIDE / SCRIPTS[engine]
    if not script.is_file():
        raise EngineEnvError(f"this ckptinspect has no {engine} dry-load yet ({script.name}); docs/verify.md says "
                             "which steps are missing", hint="--engine vllm")
    try:
        return subprocess.Popen([python, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_engine_env(pythonpath), start_new_session=True)
    except OSError as exc:
        raise EngineEnvError(f"{python}: cannot start it ({exc.strerror or exc})", hint="--engine-python") from None


def finish_dryload(proc: subprocess.Popen, engine: str, python: str, request: dict[str, Any], *,
                   deadline: float | None = None, started: float) -> tuple[dict[str, Any], float]:
    """The script's answer (a dict) and its wall time since ``started``; EngineEnvError when there is none."""
    limit = DEFAULT_DEADLINE_S if deadline is None else deadline
    from ckptinspect.verify.request import encode_request

    payload = encode_request(request)
    try:
        out, err = proc.communicate(payload, timeout=max(0.1, limit - (time.perf_counter() - started)))
    except subprocess.TimeoutExpired:
        kill_dryload(proc)
        raise EngineEnvError(f"the {engine} dry-load did not answer within {limit:g} s",
                             hint="--deadline SECONDS") from None
    except BaseException:
        kill_dryload(proc)
        raise
    seconds = time.perf_counter() - started
    stderr = err.decode(errors="replace").strip().splitlines()
    last = stderr[-1] if stderr else ""
    if proc.returncode == EXIT_ENGINE_MISSING:
        raise EngineEnvError(f"{python}: {last or f'{engine} cannot be imported'}", hint="--engine-python")
    answer = _answer(out)
    if answer is None:
        why = f"exit {proc.returncode}" + (f": {last}" if last else "")
        raise EngineEnvError(f"{python}: the {engine} dry-load script gave no answer ({why})",
                             hint="the environment is broken or is not the engine's")
    if proc.returncode == EXIT_INTERNAL or ("internal_error" in answer and "results" not in answer):
        raise EngineEnvError(f"the {engine} dry-load script failed in {python}: {answer.get('internal_error')}")
    return answer, seconds


def _answer(stdout: bytes) -> dict[str, Any] | None:
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(ANSWER_MARK):
            try:
                value = json.loads(line[len(ANSWER_MARK):])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def kill_dryload(proc: subprocess.Popen) -> None:
    """The script and anything the engine started (its own process group, started above)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()
