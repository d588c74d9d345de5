"""Install SGLang 0.5.23 (no dependencies) plus the packages `sglang.srt.server_args` imports, and
parse launch arguments with SGLang's own `ServerArgs.add_cli_args` parser in a subprocess.

The install (tests/engine_envs.py, from tests/locks/sglang-0.5.23.lock) goes to
~/.cache/ckptinspect-tests/sglang-0.5.23 (override with CKPTINSPECT_TEST_CACHE) and happens once per
machine. The subprocess keeps SGLang's pinned helper packages off the test process's sys.path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def announce(line: str) -> None:
    """One line on the console, also under pytest's output capture and in an xdist worker."""
    config = getattr(sys.modules.get("conftest"), "PYTEST_CONFIG", None)
    capman = config.pluginmanager.getplugin("capturemanager") if config is not None else None
    if capman is None:
        print(line, file=sys.stderr, flush=True)
        return
    with capman.global_and_fixture_disabled():
        print(line, file=sys.stderr, flush=True)


def ensure_sglang() -> Path:
    """SGLang 0.5.23's install folder (tests/engine_envs.py installs it from tests/locks/ once)."""
    import engine_envs

    return engine_envs.ensure(engine_envs.SGLANG, announce)


def parse_with_sglang(commands: list[list[str]]) -> dict:
    """{"results": [{"ok", "values" | "error"} per command], "choices": {flag: [...]}} from SGLang's parser."""
    target = ensure_sglang()
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", _PARSE], input=json.dumps(commands), capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang parser subprocess failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
