"""Every remote read goes through the one bounded network client (issue 36, cause 1): the GGUF Hub reader,
the audit's listing, the probe's engine (``--engine``) and main-model (``--main-url``) clients. Each case
runs the CLI in a subprocess against a hostile server on 127.0.0.1 (tests/hostile_hub_server.py,
tests/hostile_engine_server.py) and asserts what a user gets: one error line and exit 2 (130 for Ctrl-C),
no traceback, within the deadline + 10 s, at most 1 GiB of memory (the process's peak RSS), and no
credential printed or written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hostile_engine_server import HostileEngine  # noqa: E402
from hostile_hub_server import HostileHub  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GIB_KB = 1024 * 1024  # ru_maxrss is in KiB on Linux
DEADLINE_S = 5
SECRET = "pw-s3cret-7781"
# The CLI in this interpreter, reporting its own peak RSS (KiB) to the file named first.
MEASURED = """
import atexit, resource, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))
sys.argv[0] = "ckptinspect"
from ckptinspect.cli import main
main()
"""


class Run:
    def __init__(self, returncode: int, stdout: str, stderr: str, elapsed: float, peak_kb: int) -> None:
        self.returncode, self.stdout, self.stderr, self.elapsed, self.peak_kb = returncode, stdout, stderr, elapsed, peak_kb

    def one_error_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), self.stderr[-2000:]
        assert "Traceback" not in self.stderr
        return lines[0]


def cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 120, interrupt_after: float | None = None) -> Run:
    peak = tmp_path / f"peak-{time.monotonic_ns()}"
    full = {**os.environ, **(env or {})}
    full.pop("CKPTINSPECT_DEBUG", None)
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", MEASURED, str(peak), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full, cwd=str(cwd or ROOT))
    try:
        if interrupt_after is not None:
            time.sleep(interrupt_after)
            started = time.monotonic()  # from the Ctrl-C on
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"`ckptinspect {' '.join(args)}` still running after {timeout:g} s")
    elapsed = time.monotonic() - started
    return Run(proc.returncode, out, err, elapsed, int(peak.read_text()) if peak.exists() else 0)


@pytest.fixture()
def hf_env(tmp_path) -> dict[str, str]:
    home = tmp_path / "hf_home"
    return {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_TOKEN": "", "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "CKPTINSPECT_CACHE_DIR": str(tmp_path / "ck-cache"),
            "HF_HUB_DOWNLOAD_TIMEOUT": "5", "CKPTINSPECT_HTTP_BACKOFF_S": "0.01"}


# -- GGUF over the Hub ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf_repo(tmp_path_factory):
    pytest.importorskip("gguf")
    sys.path.insert(0, str(ROOT))
    from fixtures.gguf_models import MODELS, write_model

    root = tmp_path_factory.mktemp("gguf")
    small = root / "small"
    write_model(replace(MODELS["GLM-4.5-Air-Q4_K_M"], vocab=2048), small)
    big = root / "big"  # a ~3 MB tokenizer: its header needs a few MB of ranges
    tokens = [f"token-{i:08d}-with-a-longer-tail" for i in range(100_000)]
    write_model(replace(MODELS["GLM-4.5-Air-Q4_K_M"], name="BigVocab-Q4_K_M",
                        extra_kv={"tokenizer.ggml.tokens": ("strs", tokens)}), big)
    return small, big


@pytest.mark.parametrize("where", [".gguf", "/api/models/"])
def test_gguf_over_a_dripping_hub_ends_at_the_deadline(tmp_path, hf_env, gguf_repo, where):
    """One byte per second, every socket read well inside its timeout: the GGUF read still ends at the
    command's deadline (also when only the repo info drips)."""
    with HostileHub() as hub:
        hub.add_repo("org/Drip-GGUF", gguf_repo[0])
        hub.add("drip", where, 1.0)
        run = cli(tmp_path, "--deadline", str(DEADLINE_S), "report", "org/Drip-GGUF",
                  env={**hf_env, "HF_ENDPOINT": hub.url})
    line = run.one_error_line()
    assert run.returncode == 2 and "deadline" in line and "org/Drip-GGUF" in line
    assert run.elapsed <= DEADLINE_S + 10 and run.peak_kb <= GIB_KB


def test_gguf_over_the_hub_keeps_to_the_byte_budget(tmp_path, hf_env, gguf_repo):
    """A header of a few MB under a 1 MiB budget: refused before a range past the budget is asked for."""
    budget = 1 << 20
    with HostileHub() as hub:
        hub.add_repo("org/Big-GGUF", gguf_repo[1])
        run = cli(tmp_path, "report", "org/Big-GGUF", env={**hf_env, "HF_ENDPOINT": hub.url,
                                                           "CKPTINSPECT_MAX_BYTES": str(budget)})
        sent = sum(entry[4] for entry in hub.stats()["log"])
    line = run.one_error_line()
    assert run.returncode == 2 and "byte budget" in line
    assert sent <= budget  # the server never sent more than the budget allows (ranges asked within it)
    assert run.peak_kb <= GIB_KB


def test_a_password_in_hf_endpoint_is_never_printed_or_written(tmp_path, hf_env, gguf_repo):
    with HostileHub() as hub:
        hub.add_repo("org/Small-GGUF", gguf_repo[0])
        endpoint = hub.url.replace("http://", f"http://user:{SECRET}@")
        run = cli(tmp_path, "report", "org/Small-GGUF", "--format", "json", "--verbose",
                  env={**hf_env, "HF_ENDPOINT": endpoint})
        plain = hub.url
    assert run.returncode == 0, run.stderr[-2000:]
    assert SECRET not in run.stdout and SECRET not in run.stderr
    location = json.loads(run.stdout)["source"]["location"]
    assert location == f"{plain}/org/Small-GGUF"
    with HostileHub() as hub:  # and in an error line
        hub.add_repo("org/Small-GGUF", gguf_repo[0])
        hub.add("retry_after", ".gguf", 600)
        run = cli(tmp_path, "report", "org/Small-GGUF", env={**hf_env, "HF_ENDPOINT": hub.url.replace(
            "http://", f"http://user:{SECRET}@")})
    assert run.returncode == 2 and SECRET not in run.stderr and "Retry" not in run.stdout
    assert "retrying after 600 s" in run.one_error_line()


# -- the audit's listing ---------------------------------------------------------------------------------
def test_a_listing_that_links_back_to_itself_ends(tmp_path, hf_env):
    with HostileHub() as hub:
        hub.add("link_loop", "/api/models?")
        run = cli(tmp_path, "--deadline", "20", "audit", "--author", "org", env={**hf_env, "HF_ENDPOINT": hub.url})
        pages = hub.pages_served
    line = run.one_error_line()
    assert run.returncode == 2 and "points back to a page already read" in line
    assert pages == 1 and run.elapsed <= 20 + 10  # the page names itself as the next one and run.peak_kb <= GIB_KB


@pytest.mark.parametrize("listed", ["../../x", "/etc", "./dir", "dir", "org/a\x1b]0;retitled\x07",
                                    "org/b\rerror: forged line", "org/c\nerror: forged line"])
def test_listed_ids_are_hub_repo_ids_only(tmp_path, hf_env, make_fixture, listed):
    """A listing naming a path is never read as a local checkpoint (a model directory sits right there),
    and an id with terminal control never reaches the terminal raw."""
    work = tmp_path / "work" / "a" / "b"
    work.mkdir(parents=True)
    shutil.copytree(make_fixture("llama_bf16"), work / "dir")
    shutil.copytree(make_fixture("llama_bf16"), tmp_path / "work" / "x")
    with HostileHub() as hub:
        hub.listed_ids = [listed]
        hub.add("listing_ids", "/api/models?")
        run = cli(tmp_path, "audit", "--author", "org", env={**hf_env, "HF_ENDPOINT": hub.url}, cwd=work)
    line = run.one_error_line()
    assert run.returncode == 2 and "is not a repo id" in line
    assert run.stdout == ""  # no table: nothing was read, local or remote
    for text in (run.stdout, run.stderr):
        assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert not any(l.startswith("error: forged") for l in run.stderr.splitlines())


def test_a_listed_id_that_is_also_a_local_path_is_read_from_the_hub(tmp_path, hf_env, make_fixture):
    """``org/dir`` is a valid repo id and, here, a model directory too: a listed id is the Hub's repo
    (missing on this Hub: an error row), never the local directory's report."""
    work = tmp_path / "work"
    shutil.copytree(make_fixture("llama_bf16"), work / "org" / "dir")
    with HostileHub() as hub:
        hub.listed_ids = ["org/dir"]
        hub.add("listing_ids", "/api/models?")
        run = cli(tmp_path, "audit", "--author", "org", "--format", "jsonl", "--no-cache",
                  env={**hf_env, "HF_ENDPOINT": hub.url}, cwd=work)
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert [(r["repo"], r["status"]) for r in rows] == [("org/dir", "error")], run.stdout + run.stderr
    assert rows[0]["error"]["kind"] == "NotFoundError"


def test_ctrl_c_during_the_listing_exits_130_at_once(tmp_path, hf_env):
    with HostileHub() as hub:
        hub.add("drip", "/api/models?", 0.5)
        run = cli(tmp_path, "audit", "--author", "org", env={**hf_env, "HF_ENDPOINT": hub.url},
                  interrupt_after=4.0, timeout=30)
    assert run.returncode == 130, run.stderr[-2000:]
    assert run.elapsed <= 5 and "Traceback" not in run.stderr


# -- the probe's engine and main-model clients -----------------------------------------------------------
@pytest.fixture(scope="module")
def probe_model():
    pytest.importorskip("torch")
    from probe_helpers import fixture

    return fixture("mimo")


@pytest.fixture(scope="module")
def probe_prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"category": "t", "prompt": "explain check list"}) + "\n", encoding="utf-8")
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def probe_startup(tmp_path_factory, probe_model, probe_prompts):
    """Seconds the probe takes to fail against a port nothing listens on (torch, the checkpoint and its
    tokenizer load before the first request): the base the time bounds below add to."""
    tmp = tmp_path_factory.mktemp("base")
    url = f"http://127.0.0.1:{_closed_port()}"
    run = cli(tmp, "probe", probe_model, "--engine", "vllm", "--engine-url", url, "--prompts", str(probe_prompts), "-q", timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    return run.elapsed


def test_a_password_in_the_engine_url_is_never_printed(tmp_path, probe_model, probe_prompts):
    url = f"http://user:{SECRET}@127.0.0.1:{_closed_port()}"
    run = cli(tmp_path, "probe", probe_model, "--engine", "vllm", "--engine-url", url, "--prompts", str(probe_prompts), "-q", timeout=300)
    line = run.one_error_line()
    assert run.returncode == 2 and "127.0.0.1" in line
    assert SECRET not in run.stderr and SECRET not in run.stdout


ENGINE_CASES = {
    "metrics-endless": "byte limit", "metrics-drip": "deadline", "metrics-nan": "not a count",
    "metrics-inf": "not a count", "position-huge": "position label", "position-bad": "position label",
    "models-deep": "nests deeper", "completion-endless": "byte limit", "refuse": "HTTP 500",
}


@pytest.mark.parametrize("mode", sorted(ENGINE_CASES))
def test_a_hostile_engine_gives_one_error_line(tmp_path, probe_model, probe_prompts, probe_startup, mode):
    with HostileEngine(mode) as engine:
        url = engine.url if mode != "refuse" else engine.url.replace("http://", f"http://user:{SECRET}@")
        run = cli(tmp_path, "--deadline", str(DEADLINE_S), "probe", probe_model, "--engine", "vllm", "--engine-url", url, "--prompts",
                  str(probe_prompts), "--max-new-tokens", "4", "-q", timeout=300)
    line = run.one_error_line()
    assert run.returncode == 2 and ENGINE_CASES[mode] in line, line
    assert SECRET not in run.stderr and SECRET not in run.stdout
    assert run.elapsed <= probe_startup + DEADLINE_S + 10, (run.elapsed, probe_startup)
    assert run.peak_kb <= GIB_KB, run.peak_kb


def test_an_endless_main_model_server_gives_one_error_line(tmp_path, probe_model, probe_prompts, probe_startup):
    with HostileEngine("generate-endless") as engine:
        url = engine.url
        run = cli(tmp_path, "--deadline", str(DEADLINE_S), "probe", probe_model, "--main-url", url, "--device", "cpu",
                  "--prompts", str(probe_prompts), "--max-new-tokens", "4", "--steps", "1", "-q", timeout=300)
    line = run.one_error_line()
    assert run.returncode == 2 and ("byte limit" in line or "deadline" in line), line
    assert run.peak_kb <= GIB_KB, run.peak_kb
