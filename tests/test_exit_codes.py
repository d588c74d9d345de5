"""Issue 34: one exit-code table (docs/cli.md, "Exit codes") that every command follows, checked by running
each command as the CLI in a subprocess: 0 done, 1 a gate tripped, 2 bad input, 130 Ctrl-C, 141 (quietly)
when the reader closes stdout early."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from hub_repos import make_sharded_repo
from hub_server import HubServer

EXAMPLE = "ckptinspect/examples/qwen3_5_moe_nvfp4_tiny"
COMMANDS = ("report", "diff", "rules", "plan", "snapshot", "probe", "audit")


def _hub_env(home: Path, endpoint: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "CKPTINSPECT_")) and k not in ("HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME")}
    return {**env, "HF_HOME": str(home), "HF_ENDPOINT": endpoint, "PYTHONPATH": str(ROOT),
            "CKPTINSPECT_CACHE_DIR": str(home / "ckptinspect-cache")}


@pytest.fixture(scope="module")
def slow_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exit_codes") / "repo"
    make_sharded_repo(root, shards=3, experts=8)
    return root


def test_the_docs_table_lists_every_code_the_cli_uses() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = text[text.index("## Exit codes"):text.index("## Where an option does not apply")]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    assert codes == {0, 1, 2, 130, 141}
    for name in COMMANDS:
        assert f"`{name}`" in table


def test_zero_when_done(qwen35_replica, tmp_path) -> None:
    model = str(qwen35_replica)
    runs = {
        "report": run_cli("report", EXAMPLE, "--quiet"),
        "diff": run_cli("diff", EXAMPLE, EXAMPLE, "--quiet"),
        "rules": run_cli("rules", "list"),
        "plan": run_cli("plan", model, "--gpu", "h200", "--gpus", "8", "--quiet"),
        "snapshot": run_cli("snapshot", EXAMPLE, "-o", str(tmp_path / "x.json.gz"), "--quiet"),
        "probe": run_cli("probe", "--help"),
    }
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr)


def test_one_only_for_a_tripped_gate(make_fixture) -> None:
    nomtp = str(make_fixture("qwen3_5_moe_nvfp4_nomtp"))
    report = run_cli("report", nomtp, "--fail-on", "unusable", "--quiet")
    assert report.returncode == 1 and report.stderr.startswith("fail-on unusable")
    diff = run_cli("diff", EXAMPLE, nomtp, "--fail-on", "error", "--quiet")
    assert diff.returncode == 1 and diff.stderr.startswith("fail-on error")


@pytest.mark.parametrize("name, args", [
    ("report", ("report", "/no/such/dir")),
    ("diff", ("diff", EXAMPLE, "/no/such/dir")),
    ("rules", ("rules", "show", "no-such-family")),
    ("plan", ("plan", "/no/such/dir", "--gpu", "h200", "--gpus", "8")),
    ("snapshot", ("snapshot", "/no/such/dir", "-o", "/tmp/never-written.json.gz")),
    ("probe", ("probe", "/no/such/dir", "--gpu", "h200")),
    ("audit", ("audit",)),
])
def test_two_for_bad_input_with_one_line(name, args) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, (name, done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def _interrupt(args: list[str], env: dict, ready) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", *args], env=env, cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("command", ["report", "audit"])
def test_130_on_ctrl_c(slow_repo, tmp_path, command) -> None:
    """main: Ctrl-C during `report` exited 2 ("Aborted.", the bad-input code), during `audit` 130."""
    with HubServer(latency_s=0.3) as server:
        server.add_repo("org/tiny", slow_repo)
        home = tmp_path / "hf"
        args = [command, "org/tiny", "--quiet"] + (["--no-cache"] if command == "audit" else [])
        done = _interrupt(args, _hub_env(home, server.url),
                          lambda: any(home.rglob("config.json")))  # mid-read: the config is in the cache
    assert done.returncode == 130, done.stderr
    assert "interrupted" in done.stderr and "Traceback" not in done.stderr and "Aborted" not in done.stderr


def _through_head(args: list[str], env: dict) -> tuple[int, str]:
    """`ckptinspect ARGS | head -1`: the exit status of ckptinspect and its stderr."""
    cmd = " ".join([sys.executable, "-m", "ckptinspect", *args]) + " 2>err.txt | head -1 >/dev/null; echo ${PIPESTATUS[0]}"
    cwd = Path(env["HF_HOME"]).parent
    done = subprocess.run(cmd, shell=True, executable="/bin/bash", env=env, cwd=str(cwd), capture_output=True,
                          text=True, timeout=300)
    return int(done.stdout.strip()), (cwd / "err.txt").read_text()


def test_a_closed_pipe_is_quiet_and_not_the_gate_code(slow_repo, tmp_path) -> None:
    """main: `audit --format jsonl | head -1` exited 1, the --fail-on code, with nothing on stderr."""
    with HubServer(latency_s=0.05) as server:
        repos = [f"org/t{i}" for i in range(6)]
        for repo in repos:
            server.add_repo(repo, slow_repo)
        env = {**_hub_env(tmp_path / "hf", server.url), "PYTHONPATH": str(ROOT)}
        code, err = _through_head(["audit", *repos, "--format", "jsonl", "--no-cache", "--jobs", "1"], env)
        assert code == 141 and err == ""
        # the other commands write their whole document at the end: the pipe may or may not have closed
        # by then, and either way nothing is printed
        for args in (["report", str(ROOT / EXAMPLE), "--wide"], ["rules", "list"], ["rules", "show", "qwen3_5_moe"]):
            code, err = _through_head(args, env)
            assert code in (0, 141) and err == "", (args, code, err)
