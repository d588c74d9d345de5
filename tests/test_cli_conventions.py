"""CLI conventions (issue 14): progress bars, width, colour, --debug anywhere, help examples, GPU name
suggestions, references that can only be mistakes, network / offline errors, the diff gate."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_cli

ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXAMPLE = ROOT / "ckptinspect" / "examples" / "qwen3_5_moe_nvfp4_tiny"


def run_on_tty(args: list[str], *, tty: str, env: dict | None = None, timeout: float = 120) -> tuple[int, str, str]:
    """Run ``python -m ckptinspect ARGS`` with stdout or stderr (``tty``) on a pseudo-terminal."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    # A fresh pty is 0x0; tqdm (and any terminal program) sizes itself from the window.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "HF_HUB_DISABLE_PROGRESS_BARS",
                                                               "CKPTINSPECT_DEBUG")}
    full_env.update(env or {})
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, tty: slave}
    proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", *args], stdin=subprocess.DEVNULL, env=full_env,
                            cwd=str(ROOT), **streams)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise TimeoutError(args)
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    piped = proc.stderr if tty == "stdout" else proc.stdout
    other = piped.read().decode() if piped else ""
    proc.wait(timeout)
    on_tty = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return proc.returncode, on_tty, other


# -- progress bars ----------------------------------------------------------------------------------
def test_progress_enabled_follows_huggingface_hub(monkeypatch):
    from ckptinspect.cli.options import progress_enabled

    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert progress_enabled(False, Stream(True))
    assert not progress_enabled(True, Stream(True))
    assert not progress_enabled(False, Stream(False))
    for value, disabled in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False)):
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", value)
        assert progress_enabled(False, Stream(True)) is not disabled, value


@pytest.fixture(scope="module")
def hub_url(make_fixture):
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_server_process import ServerProcess

    with ServerProcess({"org/qwen": make_fixture("qwen3_5_moe_nvfp4")}) as server:
        yield server.url


def test_hub_progress_only_on_a_terminal(hub_url, tmp_path):
    """The whole wait of a Hub read (repo info, index, headers n/N) on a terminal's stderr, cleared before
    the output; nothing with --quiet, HF_HUB_DISABLE_PROGRESS_BARS or a pipe; JSON stdout untouched."""
    env = {"HF_ENDPOINT": hub_url, "HF_HUB_CACHE": str(tmp_path / "cache"), "CKPTINSPECT_HEADER_CACHE": "0"}
    code, err, out = run_on_tty(["report", "org/qwen", "--format", "json"], tty="stderr", env=env)
    assert code == 0 and json.loads(out)["totals"]["tensors"] > 0
    shards = len(json.loads(out)["shards"])
    assert "org/qwen: repo info" in err and "org/qwen: index" in err, err
    assert f"org/qwen: headers 0/{shards}" in err and f"org/qwen: headers {shards}/{shards}" in err, err
    assert f"org/qwen: scanning headers 0/{shards}" in err, err
    assert err.endswith("\r\x1b[K")  # the line is cleared
    for extra_env, extra_args in (({"HF_HUB_DISABLE_PROGRESS_BARS": "1"}, []), ({}, ["--quiet"])):
        code, err, out = run_on_tty(["report", "org/qwen", "--format", "json", *extra_args], tty="stderr",
                                    env={**env, **extra_env})
        assert code == 0 and "headers" not in err and "\r" not in err, (extra_env, extra_args)
    piped = run_cli("report", "org/qwen", "--format", "json", env=env)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


def test_local_scan_progress_only_on_a_terminal(make_fixture):
    path = str(make_fixture("qwen3_5_moe_nvfp4"))
    code, err, out = run_on_tty(["report", path, "--format", "json"], tty="stderr")
    assert code == 0 and json.loads(out)["totals"]["tensors"] > 0
    assert f"{path}: scanning headers 0/" in err and err.endswith("\r\x1b[K"), err
    piped = run_cli("report", path, "--format", "json")
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    code, err, _ = run_on_tty(["report", path, "-q"], tty="stderr")
    assert code == 0 and err == ""


# -- width ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen3_5_moe_nvfp4", "deepseek_v3_fp8", "qwen3_5_moe_nvfp4_nomtp"])
@pytest.mark.parametrize("columns", [60, 80, 120])
def test_report_text_fits_columns(name, columns, make_fixture):
    path = str(make_fixture(name))
    res = run_cli("report", path, env={"COLUMNS": str(columns)})
    assert res.returncode == 0, res.stderr
    too_long = [line for line in res.stdout.splitlines() if len(line) > columns]
    assert not too_long, too_long[:3]
    # every finding code survives the wrapping whole
    codes = {f["code"] for f in json.loads(run_cli("report", path, "--format", "json").stdout)["findings"]}
    assert all(code in res.stdout for code in codes)


def test_wide_and_machine_formats_are_full_width():
    from ckptinspect import api
    from ckptinspect.render.report import render_report

    report = api.inspect()
    full = render_report(report, "text")
    assert max(len(line) for line in full.splitlines()) > 100  # the example's findings are long
    wide = run_cli("report", "--wide", env={"COLUMNS": "60"})
    assert wide.stdout == full
    for fmt in ("json", "markdown"):
        narrow = run_cli("report", "--format", fmt, env={"COLUMNS": "40"})
        assert narrow.stdout == render_report(report, fmt), fmt


def test_diff_and_plan_text_wrap_but_commands_stay_whole(make_fixture):
    a, b = str(make_fixture("qwen3_5_moe_nvfp4")), str(make_fixture("qwen3_5_moe_nvfp4_nomtp"))
    res = run_cli("diff", a, b, env={"COLUMNS": "70"})
    assert res.returncode == 0 and max(len(x) for x in res.stdout.splitlines()) <= 70
    assert "mtp-dropped" in res.stdout

    from ckptinspect.render.terminal import wrap_text

    text = "prose " * 30 + "\ncmd --a 1 \\\n  --b " + "x" * 90 + " \\\n  --c 3\n  indented " + "word " * 30
    wrapped = wrap_text(text, 50)
    assert "  --b " + "x" * 90 + " \\" in wrapped.splitlines()  # a command line is never broken
    assert all(len(x) <= 50 for x in wrapped.splitlines() if "xxxx" not in x)
    assert wrapped.split() == text.split()  # wrapping only moves whitespace
    assert all(x.startswith("  ") for x in wrapped.split("\n  --c 3\n", 1)[1].splitlines())


# -- colour -----------------------------------------------------------------------------------------
def test_verdicts_coloured_only_on_a_terminal_without_no_color():
    code, out, _ = run_on_tty(["report"], tty="stdout", env={"COLUMNS": "200"})
    assert code == 0
    assert "\x1b[32m\x1b[1mREADY\x1b[0m" in out  # green, bold
    assert ANSI.sub("", out).count("READY") == 2
    code, out, _ = run_on_tty(["report"], tty="stdout", env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert code == 0 and "READY" in out and not ANSI.search(out)
    piped = run_cli("report")
    assert "READY" in piped.stdout and not ANSI.search(piped.stdout)


def test_colour_does_not_change_the_layout():
    from ckptinspect import api
    from ckptinspect.render.text import render_text

    report = api.inspect()
    for width in (None, 70, 100):
        assert ANSI.sub("", render_text(report, width=width, colour=True)) == render_text(report, width=width)


# -- --debug ----------------------------------------------------------------------------------------
def test_debug_after_the_subcommand(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    plain = run_cli("report", str(bad))
    assert plain.returncode == 2 and len(plain.stderr.strip().splitlines()) == 1
    for args in (("--debug", "report", str(bad)), ("report", str(bad), "--debug"), ("report", "--debug", str(bad))):
        res = run_cli(*args)
        assert res.returncode == 1 and "Traceback" in res.stderr and "ConfigError" in res.stderr, args


def test_hoist_debug_stops_at_double_dash():
    from ckptinspect.cli import hoist_debug

    assert hoist_debug(["report", "x", "--debug"]) == (["--debug", "report", "x"], True)
    assert hoist_debug(["report", "--", "--debug"]) == (["report", "--", "--debug"], False)


# -- help -------------------------------------------------------------------------------------------
def _commands() -> list[tuple[str, ...]]:
    from ckptinspect.cli import COMMANDS

    names = [(name,) for name in COMMANDS if name != "rules"]
    return names + [("rules",), ("rules", "list"), ("rules", "show"), ("rules", "validate")]


def _click_command(path: tuple[str, ...]):
    import click

    from ckptinspect.cli import cli

    ctx = click.Context(cli)
    cmd = cli.get_command(ctx, path[0])
    for part in path[1:]:
        cmd = cmd.get_command(ctx, part)
    return cmd


@pytest.mark.parametrize("path", _commands(), ids=" ".join)
def test_help_has_real_examples(path):
    res = run_cli(*path, "--help")
    assert res.returncode == 0
    examples = res.stdout.split("Examples:", 1)[1].strip().split("\n\n", 1)[0].splitlines()
    assert 1 <= len(examples) <= 3
    for line in examples:
        argv = shlex.split(line.split("  #", 1)[0], comments=True)
        assert argv[0] == "ckptinspect"
        # the example names this command (or, for a group, one of its subcommands) ...
        assert tuple(argv[1:1 + len(path)]) == path or (path == ("snapshot",) and argv[1] == "report")
        cmd = _click_command(tuple(argv[1:1 + len(path)]) if argv[1] != "rules" or len(path) > 1
                             else ("rules", argv[2]))
        known = {opt for p in cmd.params for opt in p.opts + p.secondary_opts}
        # ... and only options that command has
        assert {a for a in argv if a.startswith("-")} <= known, line


def test_plan_help_lists_every_gpu_of_the_catalog():
    gpus = yaml.safe_load((ROOT / "rules" / "gpus.yaml").read_text())["gpus"]
    for command in ("plan", "report"):
        text = " ".join(run_cli(command, "--help").stdout.split())
        for gpu in gpus:
            assert (gpu["aliases"][0] if gpu["aliases"] else gpu["name"]) in text, (command, gpu["name"])


def test_help_example_on_the_bundled_example_runs():
    res = run_cli("report", "--fail-on", "unusable", "--engine", "sglang")
    assert res.returncode == 0 and "MTP readiness" in res.stdout


# -- GPU names --------------------------------------------------------------------------------------
@pytest.mark.parametrize("typed, suggested", [("rtxpro6000", "rtx-pro-6000"), ("rtx-6000-pro", "rtx-pro-6000"),
                                              ("h2000", "h200"), ("b-200", "b200"), ("mi300", None)])
def test_unknown_gpu_suggests_the_closest(typed, suggested):
    for args in (("plan", str(EXAMPLE), "--gpu", typed, "--gpus", "8"),
                 ("report", str(EXAMPLE), "--gpu", typed, "--gpus", "8")):
        res = run_cli(*args)
        if suggested is None:  # "mi300" is an alias: accepted (the plan itself may still fail)
            assert "unknown GPU" not in res.stderr
            continue
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        match = re.search(r"did you mean ([^?]+)\?", res.stderr)
        assert match and suggested in match.group(1).split(" or "), res.stderr


# -- references that can only be mistakes -----------------------------------------------------------
def test_empty_reference_is_an_error_not_the_example():
    for command in ("report", "plan", "snapshot"):
        extra = {"plan": ["--gpu", "h200", "--gpus", "1"], "snapshot": ["-o", "/tmp/never-written.json.gz"]}
        res = run_cli(command, "", *extra.get(command, []))
        assert res.returncode == 2 and "empty model reference" in res.stderr, (command, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    assert not Path("/tmp/never-written.json.gz").exists()
    assert run_cli("report").returncode == 0  # only a missing argument means the bundled example


@pytest.mark.parametrize("inside", ["config.json", "model.safetensors.index.json",
                                    "model-00001-of-00003.safetensors"])
def test_file_inside_a_model_directory_suggests_the_directory(inside):
    res = run_cli("report", str(EXAMPLE / inside))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "file inside a model directory" in res.stderr and res.stderr.strip().endswith(str(EXAMPLE))
    assert "gzip" not in res.stderr


# -- network and offline ----------------------------------------------------------------------------
def test_no_network_names_the_endpoint_and_the_cause(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    res = run_cli("report", "org/never-reached", env={"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path),
                                                      "CKPTINSPECT_HTTP_BACKOFF_S": "0.01"})
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert endpoint in res.stderr and "ConnectionRefusedError" in res.stderr


def test_offline_says_what_is_cached_and_points_to_snapshot(tmp_path):
    commit = "a" * 40
    storage = tmp_path / "models--org--partial"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(commit)
    snap = storage / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((EXAMPLE / "config.json").read_text())
    (snap / "model.safetensors.index.json").write_text((EXAMPLE / "model.safetensors.index.json").read_text())
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    res = run_cli("report", "org/partial", env=env)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "holds for org/partial: config.json, model.safetensors.index.json" in res.stderr
    assert "ckptinspect snapshot org/partial -o" in res.stderr
    absent = run_cli("report", "org/absent", env=env)
    assert absent.returncode == 2 and "holds nothing for org/absent" in absent.stderr


# -- diff gate --------------------------------------------------------------------------------------
def test_diff_fail_on(make_fixture):
    a, b = str(make_fixture("qwen3_5_moe_nvfp4")), str(make_fixture("qwen3_5_moe_nvfp4_nomtp"))
    dropped = run_cli("diff", a, b, "--fail-on", "error")
    assert dropped.returncode == 1 and "fail-on error: mtp-dropped (error)" in dropped.stderr
    assert run_cli("diff", a, b).returncode == 0  # no gate asked: the diff itself succeeded
    same = run_cli("diff", a, a, "--fail-on", "warning")
    assert same.returncode == 0 and same.stderr == ""
    as_json = run_cli("diff", a, b, "--fail-on", "error", "--format", "json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["schema_version"] == 1


# -- the test suite's one-time SGLang install -------------------------------------------------------
@pytest.mark.skipif(not os.environ.get("CKPTINSPECT_NOTICE_PROBE"), reason="run by the test below")
def test_sglang_install_inner(monkeypatch):
    sys.path.insert(0, str(ROOT / "tests"))
    import engine_envs
    import sglang_parser

    calls = []

    def fake_pip(cmd, **kwargs):  # records the install instead of downloading 1.3 GB (a stand-in for pip)
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setenv("CKPTINSPECT_TEST_CACHE", os.environ["CKPTINSPECT_NOTICE_PROBE"])
    monkeypatch.setattr(engine_envs.subprocess, "run", fake_pip)
    sglang_parser.ensure_sglang()
    sglang_parser.ensure_sglang()  # marker written: nothing to install, nothing printed
    assert len(calls) == 1
    assert {"--require-hashes", "--no-deps"} <= set(calls[0])
    assert str(engine_envs.SGLANG.lock) in calls[0]


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["serial", "xdist"])
def test_sglang_install_prints_one_line_once_through_capture(tmp_path, workers):
    env = dict(os.environ, CKPTINSPECT_NOTICE_PROBE=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                          "tests/test_cli_conventions.py::test_sglang_install_inner"], capture_output=True,
                         text=True, env=env, cwd=str(ROOT), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:]
    notice = [line for line in (res.stdout + res.stderr).splitlines() if "ckptinspect tests: installing" in line]
    assert len(notice) == 1 and str(tmp_path) in notice[0] and "1.3 GB" in notice[0], res.stdout + res.stderr


def test_rules_list_is_one_line_per_family_at_any_width():
    families = json.loads(run_cli("rules", "list", "--format", "json").stdout)["families"]
    for columns in ("60", "200"):
        rows = run_cli("rules", "list", env={"COLUMNS": columns}).stdout.splitlines()[2:]
        assert [r.split()[0] for r in rows] == [f["id"] for f in families], columns  # greppable


# -- the same options on every command that reads a checkpoint (issue 26 item 9) ----------------------
READERS = ("report", "plan", "diff", "snapshot", "audit", "probe")
SHARED = ("--format", "--revision", "--token", "--quiet", "--verbose", "--deadline", "--request-timeout")


def _shared_params(name: str) -> dict:
    cmd = _click_command((name,))
    return {p.opts[0] if p.opts[0].startswith("--") else p.opts[-1]: p for p in cmd.params
            if any(o in SHARED for o in p.opts)}


def test_commands_that_read_a_checkpoint_share_the_same_options():
    from ckptinspect.cli import COMMANDS

    assert set(READERS) == set(COMMANDS) - {"rules"}  # a new reading command joins the list
    reference = _shared_params("report")
    assert set(reference) == set(SHARED)
    for name in READERS:
        params = _shared_params(name)
        assert set(params) == set(SHARED), (name, set(SHARED) - set(params))
        for opt, param in params.items():
            ref = reference[opt]
            assert (sorted(param.opts), param.help, param.is_flag if hasattr(param, "is_flag") else None,
                    param.envvar) == (sorted(ref.opts), ref.help, getattr(ref, "is_flag", None), ref.envvar), (name, opt)
            if opt == "--format":  # text, json and markdown everywhere (audit adds jsonl)
                assert {"text", "json", "markdown"} <= set(param.type.choices), name
                assert param.type.choices[:3] == ref.type.choices[:3]
            else:
                assert type(param.type) is type(ref.type), (name, opt)
        # ... and shows in its own --help every one it honours (the refused ones: the test below)
        text = run_cli(name, "--help").stdout
        for opt in SHARED:
            assert (opt in text) != params[opt].hidden, (name, opt)


REFUSED_IN_HELP = [("diff", "--revision"), ("audit", "--revision"), ("snapshot", "--format"), ("probe", "--token")]


def test_help_lists_no_option_the_command_then_refuses():
    """Issue 34: `--help` listed options the command then refused (diff --format markdown, diff --revision,
    probe --token, snapshot --format); docs/cli.md's table names each refusal."""
    table = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split("## Where an option does not apply")[1]
    for name, opt in REFUSED_IN_HELP:
        assert f"| `{name}` | `{opt}" in table, (name, opt)
        text = run_cli(name, "--help").stdout
        assert f"  {opt} " not in text and f"  {opt}\n" not in text, (name, opt)
    for name in ("diff", "probe"):  # they write text or JSON: markdown is not offered
        line = next(x for x in run_cli(name, "--help").stdout.splitlines() if x.strip().startswith("--format"))
        assert "markdown" not in line and "[text|json]" in line, (name, line)


def test_quiet_and_verbose_short_forms():
    for name in READERS:
        opts = {o for p in _click_command((name,)).params for o in p.opts}
        assert {"-q", "-v"} <= opts, name


@pytest.mark.parametrize("args, says", [
    (("diff", "A", "B", "--revision", "main"), "--revision does not apply to diff"),
    (("diff", "A", "B", "--format", "markdown"), "--format markdown does not apply to diff"),
    (("snapshot", "A", "-o", "x.json.gz", "--format", "json"), "--format json does not apply to snapshot"),
    (("audit", "org/a", "--revision", "main"), "--revision does not apply to audit"),
    (("probe", "A", "--format", "markdown"), "--format markdown does not apply to probe"),
    (("probe", "A", "--token", "hf_x"), "--token does not apply to probe"),
    (("probe", "org/a@v1", "--revision", "v2"), "names a revision and --revision says"),
    (("probe", ".", "--revision", "v2"), "is a local directory, not a Hub repo id"),
])
def test_options_a_command_cannot_honour_are_one_line_errors(args, says, tmp_path):
    res = subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"}, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x.json.gz").exists()


def test_shared_options_work_after_each_subcommand(make_fixture, tmp_path):
    a = str(make_fixture("qwen3_5_moe_nvfp4"))
    b = str(make_fixture("qwen3_5_moe_nvfp4_nomtp"))
    runs = {
        "report": ("report", a, "-q", "-v", "--format", "markdown", "--deadline", "30", "--request-timeout", "10"),
        "plan": ("plan", a, "--gpu", "h200", "--gpus", "8", "-q", "-v", "--format", "markdown", "--deadline", "30"),
        "diff": ("diff", a, b, "-q", "-v", "--token", "hf_unused", "--request-timeout=5", "--format", "json"),
        "snapshot": ("snapshot", a, "-o", str(tmp_path / "s.json.gz"), "-v", "--deadline", "30"),
    }
    for name, args in runs.items():
        res = run_cli(*args)
        # the tiny fixtures pass no TP divisibility check: plan reads the checkpoint and says so
        assert res.returncode == 0 or (name == "plan" and "does not run on 8x H200-SXM" in res.stderr), \
            (name, res.stderr)
        assert "stats" in res.stderr or "source:" in res.stderr, (name, res.stderr)  # --verbose said something
    diff_stats = run_cli(*runs["diff"]).stderr
    assert "stats A:" in diff_stats and "stats B:" in diff_stats
    bad = run_cli("plan", a, "--gpu", "h200", "--gpus", "8", "--deadline", "0")
    assert bad.returncode == 2 and "--deadline" in bad.stderr


def test_mistyped_command_option_and_value_suggest_the_right_one():
    cases = [(("reprot",), "did you mean 'report'"), (("report", "--fromat", "json"), "Did you mean '--format'"),
             (("report", "--format", "jsn"), "Did you mean 'json'"), (("plan", "x", "--gpu", "h200", "--gpus", "1",
              "--engine", "sglng"), "Did you mean 'sglang'"), (("rules", "lst"), "Did you mean 'list'")]
    for args, says in cases:
        res = run_cli(*args)
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, (args,
                                                                                                         res.stderr)


# -- the probe's install hint -----------------------------------------------------------------------
BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from ckptinspect.cli import main
main(sys.argv[1:])
"""


def test_probe_install_hint_names_pypi_and_a_checkout(tmp_path):
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"torch", "transformers"} <= {re.split(r"[<>=\[ ]", d)[0] for d in extras["probe"]}
    res = subprocess.run([sys.executable, "-c", BLOCK_TORCH, "probe", str(EXAMPLE)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, env={k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"})
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "pip install 'ckptinspect[probe]'" in res.stderr  # from PyPI
    assert "pip install -e '.[probe]'" in res.stderr  # from a checkout
    assert "torch missing" in res.stderr


@pytest.mark.parametrize("args", [("report", "org/x"), ("plan", "org/x", "--gpu", "h200", "--gpus", "8"),
                                  ("diff", "org/x", "org/y"), ("snapshot", "org/x", "-o", "s.json.gz")])
def test_deadline_after_the_subcommand_reaches_the_hub_reader(args, tmp_path):
    with socket.socket() as s:  # a port nobody listens on: every attempt is refused, then retried
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("CKPTINSPECT_DEBUG", "CKPTINSPECT_DEADLINE_S")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_CACHE=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-m", "ckptinspect", *args, "--deadline", "0.2"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "within its 0.2 s deadline" in res.stderr, res.stderr
