"""The locks and the shared, once-per-machine engine installs (tests/engine_envs.py, scripts/lock.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import lock as lock_script  # noqa: E402

LOCK_LINE = re.compile(r"^[a-z0-9][a-z0-9._-]*==[^\s]+ --hash=sha256:[0-9a-f]{64}$")


@pytest.mark.parametrize("lock", lock_script.LOCKS, ids=lambda lock: lock.path)
def test_every_lock_pins_each_package_it_installs_by_version_and_hash(lock):
    lines = [line for line in (ROOT / lock.path).read_text().splitlines() if line and not line.startswith("#")]
    assert lines and all(LOCK_LINE.match(line) for line in lines), [l for l in lines if not LOCK_LINE.match(l)]
    names = [line.split("==", 1)[0] for line in lines]
    assert len(names) == len(set(names)), "one version of each package"
    assert not set(names) & set(lock.exclude), "an excluded package is installed anyway"


def test_every_lock_names_what_its_in_file_asks_for():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock.py"), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_the_test_environment_is_the_locked_one():
    """What this suite runs on is what requirements/dev.lock says (a fresh machine resolves the same)."""
    from importlib.metadata import version

    locked = dict(line.split(" --hash", 1)[0].split("==", 1)
                  for line in (ROOT / "requirements" / "dev.lock").read_text().splitlines()
                  if line and not line.startswith("#"))
    for name in ("transformers", "torch", "huggingface-hub", "msgspec", "jsonschema", "click"):
        if name in locked:
            assert version(name) == locked[name], name


INSTALL = textwrap.dedent('''
    import os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    import engine_envs
    def fake_pip(cmd, **kwargs):  # a stand-in for pip: counts installs and takes long enough to overlap
        with open(os.path.join(os.environ["CKPTINSPECT_TEST_CACHE"], "installs"), "a") as fh:
            fh.write(str(os.getpid()) + "\\n")
        time.sleep(1.0)
        return subprocess.CompletedProcess(cmd, 0)
    engine_envs.subprocess.run = fake_pip
    print(engine_envs.ensure(engine_envs.SGLANG_QUANT_DEPS, lambda line: None))
''')


def _race(cache: Path, n: int = 3, script: str = INSTALL, **extra: str) -> list[str]:
    """``n`` processes running ``script`` at once against one test cache; what each printed."""
    env = dict(os.environ, CKPTINSPECT_TEST_CACHE=str(cache), **extra)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(ROOT / "tests")], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return outs


def test_concurrent_workers_install_an_environment_once(tmp_path):
    outs = _race(tmp_path)
    assert len(set(outs)) == 1 and Path(outs[0]).is_dir()
    assert len((tmp_path / "installs").read_text().split()) == 1
    _race(tmp_path)  # installed: nobody installs again
    assert len((tmp_path / "installs").read_text().split()) == 1


def test_a_different_lock_or_a_broken_install_installs_again(tmp_path):
    _race(tmp_path, n=1)
    marker = tmp_path / "sglang-0.5.23-quant-deps" / ".ckptinspect-complete"
    marker.write_text("0" * 64 + "\n")  # installed from another lock
    _race(tmp_path, n=1)
    assert len((tmp_path / "installs").read_text().split()) == 2
    marker.unlink()  # an install that never finished
    _race(tmp_path, n=1)
    assert len((tmp_path / "installs").read_text().split()) == 3


# -- the vLLM 0.34.0 source environment: one wheel, its .py files kept --------------------------------------
SOURCE_INSTALL = textwrap.dedent('''
    import io, os, subprocess, sys, time, zipfile
    sys.path.insert(0, sys.argv[1])
    import engine_envs
    def fake_pip(cmd, **kwargs):  # a stand-in for `pip download`: one small wheel into --dest
        with open(os.path.join(os.environ["CKPTINSPECT_TEST_CACHE"], "downloads"), "a") as fh:
            fh.write(" ".join(cmd) + "\\n")
        if os.environ.get("FAKE_PIP_FAILS"):
            return subprocess.CompletedProcess(
                cmd, 1, "", "WARNING: retrying\\nERROR: No matching distribution found for vllm==0.34.0\\n")
        dest = cmd[cmd.index("--dest") + 1]
        with zipfile.ZipFile(os.path.join(dest, "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"), "w") as w:
            w.writestr("vllm/config/speculative.py", "SPEC = 1\\n")
            w.writestr("vllm/_C.abi3.so", b"\\0" * 64)
            w.writestr("vllm-0.34.0.dist-info/RECORD", "")
        time.sleep(1.0)
        return subprocess.CompletedProcess(cmd, 0, "", "")
    engine_envs.subprocess.run = fake_pip
    try:
        print(engine_envs.ensure(engine_envs.VLLM_034_SRC, lambda line: None))
    except engine_envs.EngineEnvUnavailable as exc:
        print("UNAVAILABLE " + str(exc))
''')


def test_the_vllm_source_env_downloads_its_locked_wheel_once_and_keeps_only_python(tmp_path):
    outs = _race(tmp_path, 3, SOURCE_INSTALL)
    assert len(set(outs)) == 1
    downloads = (tmp_path / "downloads").read_text().splitlines()
    assert len(downloads) == 1  # three workers, one download (the flock)
    cmd = downloads[0].split()
    assert cmd[cmd.index("-r") + 1].endswith("tests/locks/vllm-0.34.0-src.lock")
    assert {"download", "--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(cmd)
    src = tmp_path / "vllm-0.34.0-src" / "src"
    kept = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    assert kept == ["vllm/config/speculative.py"]  # no kernel, no metadata, no wheel left behind
    assert not list((tmp_path / "vllm-0.34.0-src").rglob("*.whl"))
    _race(tmp_path, 1, SOURCE_INSTALL)  # installed: nothing downloaded again
    assert len((tmp_path / "downloads").read_text().splitlines()) == 1


def test_an_unreachable_index_is_one_clear_reason_and_no_marker(tmp_path):
    out = _race(tmp_path, 1, SOURCE_INSTALL, FAKE_PIP_FAILS="1")[0]
    assert out.startswith("UNAVAILABLE pip download of tests/locks/vllm-0.34.0-src.lock failed (exit 1): "
                          "ERROR: No matching distribution found for vllm==0.34.0"), out
    assert not (tmp_path / "vllm-0.34.0-src" / ".ckptinspect-complete").exists()
    # the index back: the next run installs (a failed attempt is not remembered across processes)
    assert _race(tmp_path, 1, SOURCE_INSTALL)[0].endswith("vllm-0.34.0-src")


def test_the_source_lock_pins_the_one_wheel_the_tests_read():
    import engine_envs

    lines = [line for line in engine_envs.VLLM_034_SRC.lock.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith("vllm==0.34.0 --hash=sha256:")
    assert engine_envs.VLLM_034_SRC in engine_envs.ENVS  # the background installer fetches it too


def test_a_test_reading_vllm_source_skips_with_the_reason_when_the_index_is_unreachable(monkeypatch):
    import engine_envs
    import vllm_source

    def unreachable(env, announce=None):
        raise engine_envs.EngineEnvUnavailable("pip download of tests/locks/vllm-0.34.0-src.lock failed "
                                               "(exit 1): ERROR: Could not find a version")

    monkeypatch.setattr(engine_envs, "ensure", unreachable)
    vllm_source._root.cache_clear()
    try:
        with pytest.raises(pytest.skip.Exception, match="vLLM 0.34.0's source is not available on this machine "
                           r"\(pip download of tests/locks/vllm-0.34.0-src.lock failed"):
            vllm_source.vllm_034_text("config", "speculative.py")
    finally:
        vllm_source._root.cache_clear()
