"""Usage errors (click's and the commands' own) print one line on stderr and exit 2, like every other
error; a bare `ckptinspect` still prints the help."""

from __future__ import annotations

import pytest

from conftest import run_cli


@pytest.mark.parametrize("args,needle", [
    (["report", "--bogus"], "No such option '--bogus'"),
    (["report", "--format", "xml"], "'xml' is not one of"),
    (["frobnicate"], "No such command 'frobnicate'"),
    (["report", "--gpu", "H100"], "--gpu and --gpus go together"),
    (["--deadline", "0", "report"], "Invalid value for '--deadline'"),
    (["plan"], "Missing argument"),
])
def test_usage_error_is_one_line_and_exit_2(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ckptinspect") and needle in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_bare_command_prints_the_help():
    proc = run_cli()
    assert "Commands:" in proc.stdout + proc.stderr
