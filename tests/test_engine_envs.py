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


def _race(cache: Path, n: int = 3) -> list[str]:
    env = dict(os.environ, CKPTINSPECT_TEST_CACHE=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", INSTALL, str(ROOT / "tests")], env=env,
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
