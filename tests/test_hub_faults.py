"""Network faults injected by the test Hub server: each is retried where safe, then reported as one line
naming the repo and the file (exit code 2 from the CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo, write_safetensors  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import NetworkError  # noqa: E402
from ckptinspect.sources import hub_client  # noqa: E402
from ckptinspect.settings import Settings  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402

REPO = "org/faulty"
SHARD = "model-00002-of-00003.safetensors"


@pytest.fixture(autouse=True)
def _fast_retries(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    monkeypatch.setattr(hub_client, "DEFAULT_ATTEMPTS", 3)
    monkeypatch.setattr(hub_client, "DEFAULT_BACKOFF_S", 0.01)


# the client takes its attempts and backoff from the command's Settings (ckptinspect/settings.py), so the
# reads here are given the same fast retries the fixture sets for any client built without settings
FAST = Settings(http_attempts=3, http_backoff_s=0.01)


@pytest.fixture()
def served(tmp_path):
    root = tmp_path / "repo"
    headers = make_sharded_repo(root, shards=3, experts=8)
    with HubServer() as server:
        server.add_repo(REPO, root)
        yield server, headers


def _shard_gets(server) -> list[tuple]:
    return [e for e in server.stats()["log"] if e[1].startswith("/cdn/") and e[1].endswith(SHARD)]


@pytest.mark.parametrize("kind", ["timeout", "5xx", "429", "reset", "truncate", "wrong-range"])
def test_transient_fault_is_retried(served, kind):
    server, headers = served
    server.add_fault(kind, path_contains=SHARD, times=1, delay_s=1.0)
    raw = open_hub(REPO, endpoint=server.url, progress=False, timeout=0.3, settings=FAST)
    assert dict(raw.headers) == headers
    assert raw.stats["retries"] == 1
    assert len(_shard_gets(server)) == 2


@pytest.mark.parametrize("kind,needle", [
    ("timeout", "timed out"),
    ("5xx", "HTTP 503"),
    ("reset", "connection error"),
    ("truncate", "truncated body"),  # peer closed before Content-Length bytes arrived
    ("wrong-range", "wrong Content-Range"),
])
def test_persistent_fault_gives_one_line_naming_repo_and_file(served, kind, needle):
    server, _ = served
    server.add_fault(kind, path_contains=SHARD, delay_s=1.0)
    with pytest.raises(NetworkError) as err:
        open_hub(REPO, endpoint=server.url, progress=False, timeout=0.3, settings=FAST)
    message = str(err.value)
    assert message.startswith(f"{REPO}/{SHARD}: ")
    assert needle in message and "3 attempts" in message
    assert "\n" not in message
    assert len(_shard_gets(server)) == 3  # bounded retries


def test_server_ignoring_range_is_cut_off_after_the_header(tmp_path):
    """A 200 with the whole 2 GiB file: stop reading after the header, never download weights."""
    root = tmp_path / "repo"
    header = write_safetensors(root / "model.safetensors", ["model.embed_tokens.weight"],
                               tensor_bytes=2 * 1024 ** 3, shape=(1024, 1024 ** 2))
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    with HubServer() as server:
        server.add_repo(REPO, root)
        server.add_fault("ignore-range", path_contains="model.safetensors")
        raw = open_hub(REPO, endpoint=server.url, progress=False, settings=FAST)
        time.sleep(0.3)  # let the server notice the closed connection
        sent = sum(e[4] for e in server.stats()["log"] if e[1].endswith("model.safetensors"))
        statuses = [e[3] for e in server.stats()["log"] if e[1].startswith("/cdn/")]
    assert raw.headers["model.safetensors"] == header
    assert statuses == [200]
    assert raw.stats["bytes_fetched"] < 1024 ** 2  # what we read
    assert sent < 64 * 1024 ** 2  # what left the server before the reset: socket buffers, not 2 GiB


def test_short_206_answers_are_stitched(served):
    server, headers = served
    server.add_fault("short", path_contains=SHARD, short_bytes=1000)
    raw = open_hub(REPO, endpoint=server.url, progress=False, settings=FAST)
    assert dict(raw.headers) == headers
    n = len(headers[SHARD]) + 8
    assert len(_shard_gets(server)) == -(-n // 1000)  # ceil: every answer made progress


def test_cli_exit_code_2_and_one_stderr_line(served, tmp_path):
    server, _ = served
    server.add_fault("5xx", path_contains=SHARD)
    env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "cli_home"),
           "CKPTINSPECT_HTTP_ATTEMPTS": "2", "CKPTINSPECT_HTTP_BACKOFF_S": "0.01",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("CKPTINSPECT_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "snapshot", REPO, "-o", str(tmp_path / "s.json.gz"),
                           "--quiet"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert REPO in lines[0] and SHARD in lines[0] and "HTTP 503" in lines[0]
    assert not (tmp_path / "s.json.gz").exists()
