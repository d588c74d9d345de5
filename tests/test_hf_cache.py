"""Repo ids answered from the HF cache, filled by huggingface_hub's own snapshot_download from the test Hub
server (so the layout is the real one); offline behaviour with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import NotFoundError  # noqa: E402
from ckptinspect.sources.hf_cache import describe_cache_gap, hub_cache_dir, open_hf_cache  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402

REPO = "org/cached"


@pytest.fixture()
def cached_repo(tmp_path, monkeypatch):
    """(headers, commit, snapshot dir) of a repo fully downloaded into a temporary HF_HOME."""
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    root = tmp_path / "repo"
    headers = make_sharded_repo(root, shards=3, experts=4)
    from huggingface_hub import snapshot_download

    with HubServer() as server:
        server.add_repo(REPO, root)
        path = snapshot_download(REPO, endpoint=server.url, cache_dir=str(hub_cache_dir()))
        commit = server._repos[REPO].commits["main"]
    return headers, commit, Path(path)


def test_fully_cached_repo_reads_headers_locally(cached_repo):
    headers, commit, snapshot = cached_repo
    raw = open_hf_cache(REPO)
    assert raw is not None and raw.kind == "hf-cache"
    assert raw.revision == commit
    assert Path(raw.location) == snapshot
    assert {k: bytes(raw.headers[k]) for k in raw.headers} == headers
    assert raw.json_files["config.json"]["model_type"] == "tiny_moe"
    assert raw.file_sizes["model-00001-of-00003.safetensors"] == (snapshot / "model-00001-of-00003.safetensors").stat().st_size
    assert open_hf_cache(REPO, revision=commit) is not None  # a commit hash needs no ref


def test_hf_hub_cache_wins_over_hf_home(cached_repo, monkeypatch, tmp_path):
    """huggingface_hub's HF_HUB_CACHE (its constants: it reads the variable at import) is the cache read."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert open_hf_cache(REPO) is None
    assert "not in the HF cache" in describe_cache_gap(REPO)


def test_partial_cache_names_what_is_missing(cached_repo):
    _, commit, snapshot = cached_repo
    (snapshot / "model-00002-of-00003.safetensors").unlink()
    assert open_hf_cache(REPO) is None
    gap = describe_cache_gap(REPO)
    assert "model-00002-of-00003.safetensors" in gap and commit[:12] in gap
    with pytest.raises(NotFoundError) as err:
        open_hf_cache(REPO, required=True)
    assert "model-00002-of-00003.safetensors" in str(err.value) and REPO in str(err.value)


def test_unknown_revision_is_not_cached(cached_repo):
    assert open_hf_cache(REPO, revision="v9") is None
    assert "revision 'v9'" in describe_cache_gap(REPO, "v9")


def test_offline_hub_read_fails_with_the_cache_gap(cached_repo, monkeypatch):
    _, _, snapshot = cached_repo
    (snapshot / "model-00003-of-00003.safetensors").unlink()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
    with pytest.raises(NotFoundError) as err:
        open_hub(REPO, endpoint="http://127.0.0.1:9", progress=False)  # nothing listens there
    assert "HF_HUB_OFFLINE=1" in str(err.value) and "model-00003-of-00003.safetensors" in str(err.value)


def test_open_source_uses_the_cache_offline_without_a_server(cached_repo, monkeypatch):
    headers, _, _ = cached_repo
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    from ckptinspect.sources import open_source

    raw = open_source(REPO)
    assert raw.kind == "hf-cache"
    assert {k: bytes(raw.headers[k]) for k in raw.headers} == headers


def test_hub_run_fills_the_cache_with_json_only(tmp_path, monkeypatch):
    """After a Hub read the cache holds config + index (not the shards), so it is not 'fully cached'."""
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=2, experts=2)
    with HubServer() as server:
        server.add_repo(REPO, root)
        open_hub(REPO, endpoint=server.url, progress=False)
    assert open_hf_cache(REPO) is None
    gap = describe_cache_gap(REPO)
    assert "model-00001-of-00002.safetensors" in gap and "config.json" not in gap


def test_cli_offline_error_names_the_missing_shard(cached_repo, monkeypatch, tmp_path):
    import subprocess

    _, _, snapshot = cached_repo
    (snapshot / "model-00001-of-00003.safetensors").unlink()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "snapshot", REPO, "-o", str(tmp_path / "x.json.gz"),  # outside the
                           "--quiet"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "HF_HUB_OFFLINE=1" in proc.stderr and "model-00001-of-00003.safetensors" in proc.stderr
