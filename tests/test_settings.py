"""Settings (ckptinspect/settings.py): one table, parsed once at the edge.

- Every variable of the table, set to garbage (a word, empty, 1e309, nan, -1, a huge integer, ...), is one
  error line naming it and exit 2 from the real CLI, with no traceback.
- A valid value takes effect: the CLI run against the test Hub server (or the GPU catalog, or the
  error path) behaves differently with it, one observable behaviour per variable where one exists; the
  rest are followed from the table into the record their consumer is built from.
- Nothing under ckptinspect/ except cli/ and settings.py reads or writes the environment.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.settings import BY_NAME, DEFAULTS, VARIABLES, Settings, SettingsError, parse  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ckptinspect"
REPO = "org/settings"
HUGE = "9" * 400  # float() reads it as inf; int() of 4,301 digits raises: both must be a plain "out of range"

# Values no variable of a kind accepts (each kind also refuses an empty value); the first six of a number
# kind are the list (a word, empty, 1e309, nan, -1, a huge integer).
GARBAGE = {
    "seconds": ["abc", "", "1e309", "nan", "-1", HUGE, "  ", "inf", "0x10", "1_0", "-" + HUGE],
    "bytes": ["abc", "", "1e309", "nan", "-1", HUGE, "1e9", "1.5"],
    "whole seconds": ["abc", "", "1e309", "nan", "-1", HUGE, "0.5", "0"],
    "count": ["abc", "", "1e309", "nan", "-1", HUGE, "0", "2.0"],
    "switch": ["abc", "", "2", "maybe", "-1", "nan"],
    "path": [""],
    "directory": ["", "relative/dir"],
    "url": ["", "abc", "ftp://host/", "http://", "https:// spaced"],
    "choice": ["abc", "", "static compile", "nan", "-1", "1"],
}
# Values every variable of a kind accepts, with what they parse to.
VALID = {"seconds": ("1.5", 1.5), "whole seconds": ("3", 3.0), "bytes": ("1048576", 1 << 20), "count": ("3", 3), "switch": ("off", False),
         "path": ("spec.yaml", Path("spec.yaml")), "directory": ("/tmp/ck", Path("/tmp/ck")),
         "url": ("http://127.0.0.1:9", "http://127.0.0.1:9"), "choice": ("Static", "static")}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in BY_NAME}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=str(ROOT))


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert done.stdout == ""
    return lines[0]


# -- the table ---------------------------------------------------------------------------------------
def test_the_table_has_one_row_per_field_and_its_defaults_are_within_bounds():
    assert sorted(v.field for v in VARIABLES) == sorted(f.name for f in fields(Settings))
    assert len({v.name for v in VARIABLES}) == len(VARIABLES)
    for variable in VARIABLES:
        assert variable.kind in GARBAGE, variable
        assert variable.doc and variable.default
        default = getattr(DEFAULTS, variable.field)
        if variable.low is not None:  # a number: finite bounds, the default inside them, said in the docs
            assert variable.high is not None and variable.high < float("inf")
            if default is not None:  # the documented default is the record's
                assert parse(variable, str(int(default) if default == int(default) else default)) == default
                assert float(variable.default.split()[0].replace(",", "")) == default, variable


def test_settings_are_frozen_and_read_no_environment_by_default(monkeypatch):
    monkeypatch.setenv("CKPTINSPECT_DEADLINE_S", "7")
    assert Settings().deadline_s == DEFAULTS.deadline_s == 300
    assert Settings.from_environ().deadline_s == 7
    assert Settings.from_environ({}).deadline_s == 300  # an explicit mapping: only it is read
    with pytest.raises(AttributeError):
        DEFAULTS.deadline_s = 1  # type: ignore[misc]


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda v: v.name)
def test_every_garbage_value_is_a_settings_error_naming_the_variable(variable):
    for value in GARBAGE[variable.kind]:
        with pytest.raises(SettingsError) as err:
            Settings.from_environ({variable.name: value})
        message = str(err.value)
        assert message.startswith(variable.name) and "\n" not in message, message
        assert "allowed:" in message
    text, parsed = VALID[variable.kind]
    assert getattr(Settings.from_environ({variable.name: text}), variable.field) == parsed


def test_the_default_cache_directory_follows_xdg_and_is_never_relative():
    from ckptinspect.settings import default_cache_dir

    home = Path.home() / ".cache" / "ckptinspect"
    assert Settings.from_environ({"XDG_CACHE_HOME": "/srv/cache"}).cache_dir == Path("/srv/cache/ckptinspect")
    for ignored in ("", "  ", "relative/cache"):
        assert default_cache_dir({"XDG_CACHE_HOME": ignored}) == home
    assert Settings.from_environ({"CKPTINSPECT_CACHE_DIR": "/srv/ck", "XDG_CACHE_HOME": "/x"}).cache_dir == Path("/srv/ck")


def test_numbers_at_their_bounds():
    deadline = BY_NAME["CKPTINSPECT_DEADLINE_S"]
    assert parse(deadline, "604800") == 604800.0
    for bad in ("604800.001", "0", "0.0", "-0"):
        with pytest.raises(SettingsError, match="out of range"):
            parse(deadline, bad)
    backoff = BY_NAME["CKPTINSPECT_HTTP_BACKOFF_S"]
    assert parse(backoff, "0") == 0.0  # no backoff is allowed; no time limit of 0 is
    with pytest.raises(SettingsError, match="not a finite number"):
        parse(deadline, "1e309")
    with pytest.raises(SettingsError, match="out of range"):
        parse(BY_NAME["CKPTINSPECT_MAX_WORKERS"], HUGE)


def test_switches_accept_the_documented_words_only():
    debug = BY_NAME["CKPTINSPECT_DEBUG"]
    for word, value in (("1", True), ("TRUE", True), (" yes ", True), ("On", True),
                        ("0", False), ("false", False), ("NO", False), ("off", False)):
        assert parse(debug, word) is value
    with pytest.raises(SettingsError, match="not a switch"):
        parse(debug, "enabled")


def test_a_password_in_hf_endpoint_is_never_echoed():
    with pytest.raises(SettingsError) as err:
        Settings.from_environ({"HF_ENDPOINT": "ftp://user:s3cret@host/"})
    assert "s3cret" not in str(err.value) and "HF_ENDPOINT" in str(err.value)


def test_the_api_reads_the_environment_only_without_settings(monkeypatch):
    """The library's edge: ``api.inspect(settings=...)`` uses what it is given and reads no variable; without
    it, the environment is read once, as the CLI reads it (so a broken variable is the same error)."""
    from ckptinspect import api

    monkeypatch.setenv("CKPTINSPECT_HTTP_ATTEMPTS", "abc")
    report = api.inspect(settings=Settings())  # the bundled example
    assert report.checkpoint.format == "safetensors"
    with pytest.raises(SettingsError, match="CKPTINSPECT_HTTP_ATTEMPTS='abc'"):
        api.inspect()


# -- the CLI: every variable, garbage -> one line, exit 2 ------------------------------------------------
@pytest.mark.parametrize("variable", VARIABLES, ids=lambda v: v.name)
def test_cli_garbage_is_one_error_line_and_exit_2(variable):
    """In a real process, for each of the first six garbage values of the variable's kind (the whole
    list in-process below)."""
    for value in GARBAGE[variable.kind][:6]:
        line = _one_error_line(_cli("report", "--quiet", env=_env(**{variable.name: value})))
        assert line.startswith(f"error: {variable.name}"), line
        if variable.kind != "url":
            assert repr(value if len(value) <= 40 else value[:40] + "...") in line


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda v: v.name)
def test_cli_main_turns_every_garbage_value_into_one_line(variable, monkeypatch, capsys):
    """The whole garbage list through ``ckptinspect.cli.main`` (the console script's entry point)."""
    from ckptinspect.cli import main

    for value in GARBAGE[variable.kind]:
        monkeypatch.setenv(variable.name, value)
        with pytest.raises(SystemExit) as done:
            main(["rules", "list"])
        assert done.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert captured.err.startswith(f"error: {variable.name}")
    monkeypatch.delenv(variable.name)


@pytest.mark.parametrize("flag", ["--deadline", "--request-timeout"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e309", "0", "-5", "abc", HUGE])
def test_flags_are_parsed_like_their_variables(flag, value):
    """--deadline inf no longer turns the deadline off: the flag has the variable's bounds."""
    done = _cli("report", "--quiet", flag, value, env=_env())
    line = _one_error_line(done)
    assert f"'{flag}'" in line and "allowed:" in line


def test_a_set_variable_is_checked_even_when_its_flag_overrides_it():
    line = _one_error_line(_cli("report", "--quiet", "--deadline", "5", env=_env(CKPTINSPECT_DEADLINE_S="soon")))
    assert line.startswith("error: CKPTINSPECT_DEADLINE_S='soon'")


# -- valid values take effect -------------------------------------------------------------------------
def test_debug_switch_is_read_as_a_switch():
    """CKPTINSPECT_DEBUG=0 (and off / no / false) no longer turns debug on; 1 does."""
    for off in ("0", "off", "no", "false"):
        line = _one_error_line(_cli("report", "/nonexistent-dir", env=_env(CKPTINSPECT_DEBUG=off)))
        assert "no such directory" in line
    done = _cli("report", "/nonexistent-dir", env=_env(CKPTINSPECT_DEBUG="1"))
    assert done.returncode == 1 and "Traceback" in done.stderr and "NotFoundError" in done.stderr


def test_gpu_spec_variable_adds_a_card(tmp_path):
    import json

    import yaml

    card = dict(yaml.safe_load((ROOT / "rules" / "gpus.yaml").read_text(encoding="utf-8"))["gpus"][0])
    card.update(name="Settings-Test-Card", aliases=["stc"])
    spec = tmp_path / "cards.json"
    spec.write_text(json.dumps({"schema_version": 1, "gpus": [card]}), encoding="utf-8")
    args = ("report", "--gpu", "stc", "--gpus", "1", "--quiet", "--format", "json")
    assert _cli(*args, env=_env()).returncode == 2  # not in the catalog
    done = _cli(*args, env=_env(CKPTINSPECT_GPU_SPEC=str(spec)))
    assert done.returncode == 0, done.stderr
    assert "Settings-Test-Card" in done.stdout


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings") / "repo"
    make_sharded_repo(root, shards=3, experts=8)
    with HubServer() as server:
        server.add_repo(REPO, root)
        yield server


def _hub_env(hub, tmp_path, **extra: str) -> dict[str, str]:
    return _env(**{"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_home"),
                   "CKPTINSPECT_CACHE_DIR": str(tmp_path / "ck"), "CKPTINSPECT_HTTP_BACKOFF_S": "0.01", **extra})


def _report(hub, tmp_path, **extra: str) -> subprocess.CompletedProcess:
    return _cli("report", REPO, "--quiet", "--format", "json", env=_hub_env(hub, tmp_path, **extra))


def test_hf_endpoint_names_the_hub(hub, tmp_path):
    done = _report(hub, tmp_path)
    assert done.returncode == 0, done.stderr
    refused = _cli("report", REPO, "--quiet", env=_env(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "h2"),
                                                      CKPTINSPECT_HTTP_ATTEMPTS="1", CKPTINSPECT_HEADER_CACHE="0"))
    assert "127.0.0.1:9" in _one_error_line(refused)


def test_http_attempts_and_backoff(hub, tmp_path):
    hub.add_fault("5xx", path_contains="/api/models/", times=1)
    assert _report(hub, tmp_path / "a").returncode == 0  # default 4 attempts: the one 503 is retried
    hub.add_fault("5xx", path_contains="/api/models/", times=1)
    line = _one_error_line(_report(hub, tmp_path / "b", CKPTINSPECT_HTTP_ATTEMPTS="1"))
    assert "503" in line
    # a first backoff of 20 s does not fit a 1 s waiting allowance: the request ends at once, saying so (a
    # shard's 503 carries no Retry-After, so the backoff decides the wait)
    hub.add_fault("5xx", path_contains="model-00002-of-00003.safetensors", times=1)
    line = _one_error_line(_report(hub, tmp_path / "c", CKPTINSPECT_HTTP_BACKOFF_S="20", CKPTINSPECT_RETRY_WAIT_S="1"))
    assert "would pass the 1 s a request may spend waiting" in line


def test_max_bytes_is_the_commands_byte_budget(hub, tmp_path):
    line = _one_error_line(_report(hub, tmp_path, CKPTINSPECT_MAX_BYTES="2000"))
    assert "2,000 byte budget" in line and "CKPTINSPECT_MAX_BYTES" in line


def test_deadline_and_request_timeout(hub, tmp_path):
    hub.add_fault("timeout", path_contains=".safetensors", delay_s=3.0, times=2)
    line = _one_error_line(_report(hub, tmp_path / "a", CKPTINSPECT_DEADLINE_S="1"))
    assert "did not finish within its 1 s deadline" in line
    hub.faults.clear()
    hub.add_fault("timeout", path_contains=".safetensors", delay_s=3.0)
    line = _one_error_line(_report(hub, tmp_path / "b", CKPTINSPECT_REQUEST_TIMEOUT_S="0.5",
                                   CKPTINSPECT_HTTP_ATTEMPTS="1", HF_HUB_DOWNLOAD_TIMEOUT="30"))
    assert "no complete answer within 0.5 s" in line
    line = _one_error_line(_report(hub, tmp_path / "c", HF_HUB_DOWNLOAD_TIMEOUT="1", CKPTINSPECT_HTTP_ATTEMPTS="1"))
    assert re.search(r"time(d)? ?out|Timeout", line), line
    hub.faults.clear()


def test_header_cache_switch_dir_and_size(hub, tmp_path):
    assert _report(hub, tmp_path / "on").returncode == 0
    stored = list((tmp_path / "on" / "ck" / "hub-headers").glob("*.hdr"))
    assert len(stored) == 3  # one entry per shard, in CKPTINSPECT_CACHE_DIR
    assert _report(hub, tmp_path / "off", CKPTINSPECT_HEADER_CACHE="0").returncode == 0
    assert not (tmp_path / "off" / "ck" / "hub-headers").exists()
    assert _report(hub, tmp_path / "tiny", CKPTINSPECT_HEADER_CACHE_MAX_BYTES="0").returncode == 0
    assert list((tmp_path / "tiny" / "ck" / "hub-headers").glob("*.hdr")) == []  # trimmed to 0 bytes


def test_max_workers_bounds_requests_in_flight(tmp_path):
    root = tmp_path / "wide"
    make_sharded_repo(root, shards=8, experts=4)
    with HubServer(latency_s=0.05) as server:
        server.add_repo(REPO, root)
        done = _report(server, tmp_path, CKPTINSPECT_MAX_WORKERS="1", CKPTINSPECT_HEADER_CACHE="0")
        assert done.returncode == 0, done.stderr
        server.stats()  # every answer logged
        one = server.peak_in_flight
        server.peak_in_flight = 0
        done = _report(server, tmp_path, CKPTINSPECT_MAX_WORKERS="8", CKPTINSPECT_HEADER_CACHE="0")
        assert done.returncode == 0, done.stderr
        server.stats()
        # (the small JSON files are read at once whatever the setting: the header requests make the difference)
        assert one < server.peak_in_flight, (one, server.peak_in_flight)


def test_limits_reach_the_records_their_consumers_are_built_from(tmp_path):
    """CONNECT_TIMEOUT_S has no cheap observable (it needs an address that drops SYNs): it is followed
    into the client's limits, as every other limit is; the probe's two memory limits into run_probe's
    arguments (their effect: tests/test_probe_batching.py, tests/test_probe_long.py)."""
    from ckptinspect.sources.hub_client import make_client
    from ckptinspect.sources.net_limits import Budget, NetLimits

    settings = Settings.from_environ({"CKPTINSPECT_CONNECT_TIMEOUT_S": "2.5", "HF_HUB_DOWNLOAD_TIMEOUT": "3",
                                      "CKPTINSPECT_REQUEST_TIMEOUT_S": "4.5", "CKPTINSPECT_DEADLINE_S": "5.5",
                                      "CKPTINSPECT_MAX_BYTES": "6000", "CKPTINSPECT_RETRY_WAIT_S": "7.5"})
    limits = NetLimits.from_settings(settings)
    assert (limits.connect_s, limits.read_s, limits.request_s, limits.deadline_s, limits.max_bytes,
            limits.retry_wait_s) == (2.5, 3.0, 4.5, 5.5, 6000, 7.5)
    import asyncio

    client = make_client(Budget(limits))
    try:
        assert (client.timeout.connect, client.timeout.read) == (2.5, 3.0)
    finally:
        asyncio.run(client.aclose())
    probe = Settings.from_environ({"CKPTINSPECT_PROBE_MEMORY_LIMIT": "123", "CKPTINSPECT_PROBE_HOST_MEMORY_LIMIT": "456"})
    from ckptinspect.probe.streamed_run import host_budget

    assert (probe.probe_memory_limit, host_budget(probe.probe_host_memory_limit)) == (123, 456)


def test_probe_memory_limit_variable_reaches_the_probe(tmp_path):
    """CKPTINSPECT_PROBE_MEMORY_LIMIT=1 through the CLI: the probe of a tiny MTP checkpoint refuses to
    start, naming the 1 byte it was allowed (skipped without the probe extra)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from probe_helpers import fixture

    done = _cli("probe", fixture("deepseek"), "--device", "cpu", "--max-prompts", "1", "--quiet",
                env=_env(CKPTINSPECT_PROBE_MEMORY_LIMIT="1"), timeout=300)
    line = _one_error_line(done)
    assert "0.0 GiB is free" in line


# -- nothing below the edge reads the environment --------------------------------------------------------
EDGE = ("ckptinspect/cli/", "ckptinspect/settings.py")
# Modules the scan worker's removal deletes (issue 35 step 1); listed only while they exist.
# Modules that set up another process's environment, not this one's settings: the engine-side scripts of
# `verify` run inside the engine's own Python (never imported here), and verify/engine.py hands that child
# this process's environment less the variables that would put ckptinspect's packages on its path.
CHILD_ENVIRONMENTS = ("ckptinspect/verify/engine.py", "ckptinspect/verify/engine_side/")


def environment_uses(rel: str, source: str) -> list[str]:
    """``os.environ`` / ``os.getenv`` / ``os.putenv`` / ``environ`` / ``getenv`` named in one module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            name = next((a.name for a in node.names if a.name in ("environ", "getenv", "putenv", "environb")), None)
        if name in ("environ", "getenv", "putenv", "environb", "unsetenv"):
            out.append(f"{rel}:{node.lineno} {name}")
    return sorted(set(out))


def test_environment_checker_flags_what_it_must():
    src = "import os\nfrom os import getenv\nx = os.environ.get('A')\ny = os.getenv('B')\n"
    assert environment_uses("m.py", src) == ["m.py:2 getenv", "m.py:3 environ", "m.py:4 getenv"]
    assert environment_uses("m.py", "import os\nos.path.join('a')\n") == []


def test_nothing_below_the_cli_reads_the_environment():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(EDGE) or rel.startswith(CHILD_ENVIRONMENTS):
            continue
        found += environment_uses(rel, path.read_text(encoding="utf-8"))
    assert found == []
    assert environment_uses("ckptinspect/settings.py", (ROOT / "ckptinspect/settings.py").read_text()) != []


def test_only_the_edges_read_settings_from_the_environment():
    """``Settings.from_environ`` / ``or_environ`` are called by the CLI and the api only."""
    callers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if rel != "ckptinspect/settings.py" and re.search(r"\b(from_environ|or_environ)\(", text):
            callers.add(rel.split("/")[1] if rel.startswith("ckptinspect/cli/") else rel)
    assert callers == {"cli", "ckptinspect/api.py"}
