"""Install SGLang 0.5.23 (no dependencies) plus the packages `sglang.srt.server_args` imports, and
parse launch arguments with SGLang's own `ServerArgs.add_cli_args` parser in a subprocess.

The install goes to ~/.cache/ckptinspect-tests/sglang-0.5.23 (override with CKPTINSPECT_TEST_CACHE)
and happens once; a marker file records success. The subprocess keeps SGLang's pinned helper
packages off the test process's sys.path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SGLANG = "sglang==0.5.23"
# Found by importing sglang.srt.server_args until it stopped failing (see CONTRIBUTING.md, "Tests").
# triton is the only large one (~290 MB wheel): sglang/srt/utils/common.py imports it at top level.
IMPORT_DEPS = (
    "orjson", "psutil", "pybase64", "requests", "urllib3", "certifi", "triton", "pillow", "starlette",
    "msgspec", "pyzmq", "ipython", "traitlets", "aiohttp", "multidict", "yarl", "propcache",
    "aiohappyeyeballs", "aiosignal", "frozenlist",
)

_PARSE = r"""
import argparse, json, sys, warnings
warnings.simplefilter("ignore")
from sglang.srt.server_args import ServerArgs

class Rejected(Exception):
    pass

def build():
    p = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(p)
    def error(message):
        raise Rejected(message)
    p.error = error
    return p

commands = json.load(sys.stdin)
out = []
for args in commands:
    parser = build()
    try:
        ns = parser.parse_args(args)
        out.append({"ok": True, "values": {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))}})
    except Rejected as exc:
        out.append({"ok": False, "error": str(exc)})
choices = {}
for action in build()._actions:
    if action.choices and action.option_strings:
        choices[action.option_strings[0]] = list(action.choices)
print(json.dumps({"results": out, "choices": choices}))
"""


def cache_dir() -> Path:
    base = Path(os.environ.get("CKPTINSPECT_TEST_CACHE", Path.home() / ".cache" / "ckptinspect-tests"))
    return base / "sglang-0.5.23"


INSTALL_NOTICE = ("ckptinspect tests: installing {what} into {target} once (about 1.3 GB on disk, a few "
                  "minutes; CKPTINSPECT_TEST_CACHE moves it)")


def announce(line: str) -> None:
    """One line on the console, also under pytest's output capture and in an xdist worker."""
    config = getattr(sys.modules.get("conftest"), "PYTEST_CONFIG", None)
    capman = config.pluginmanager.getplugin("capturemanager") if config is not None else None
    if capman is None:
        print(line, file=sys.stderr, flush=True)
        return
    with capman.global_and_fixture_disabled():
        print(line, file=sys.stderr, flush=True)


def announce_once(line: str, flag: Path) -> None:
    """``announce`` from the first of the test processes that get here (pytest-xdist workers install in
    parallel; main printed the line once per worker): ``flag`` is created atomically by exactly one."""
    flag.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    announce(line)


def ensure_sglang() -> Path:
    target = cache_dir()
    marker = target / ".ckptinspect-complete"
    if marker.is_file():
        return target
    flag = target.parent / f".{target.name}.announced"
    announce_once(INSTALL_NOTICE.format(what=f"{SGLANG} (no dependencies) and triton", target=target), flag)
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--target", str(target), "--upgrade", SGLANG, *IMPORT_DEPS]
    subprocess.run(cmd, check=True, timeout=1800)
    marker.write_text(SGLANG + "\n" + "\n".join(IMPORT_DEPS) + "\n", encoding="utf-8")
    flag.unlink(missing_ok=True)  # a later reinstall announces itself again
    return target


def parse_with_sglang(commands: list[list[str]]) -> dict:
    """{"results": [{"ok", "values" | "error"} per command], "choices": {flag: [...]}} from SGLang's parser."""
    target = ensure_sglang()
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", _PARSE], input=json.dumps(commands), capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang parser subprocess failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
