"""The test Hub server speaks the protocol huggingface_hub expects: checked with huggingface_hub's own calls
and error mapping, so the other Hub tests exercise real client behaviour."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import NetworkError  # noqa: E402
from ckptinspect.sources import hub_client  # noqa: E402
from ckptinspect.sources.hf_cache import hub_cache_dir  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402


@pytest.fixture()
def served(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=2, experts=2)
    with HubServer() as server:
        server.add_repo("org/tiny", root)
        server.add_repo("org/gated", root, gated_token="hf_ok")
        yield server, root


def test_file_listing_and_tree(served):
    from huggingface_hub import HfApi

    server, root = served
    api = HfApi(endpoint=server.url)
    expected = sorted(p.name for p in root.iterdir())
    assert sorted(api.list_repo_files("org/tiny")) == expected
    tree = {f.path: f for f in api.list_repo_tree("org/tiny", recursive=True)}
    shard = "model-00001-of-00002.safetensors"
    assert tree[shard].size == (root / shard).stat().st_size and tree[shard].lfs is not None
    assert tree["config.json"].lfs is None


def test_head_metadata_off_the_cdn_redirect(served):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    server, root = served
    shard = "model-00002-of-00002.safetensors"
    meta = get_hf_file_metadata(hf_hub_url("org/tiny", shard, endpoint=server.url))
    assert meta.commit_hash == server._repos["org/tiny"].commits["main"]
    assert meta.size == (root / shard).stat().st_size  # X-Linked-Size of the 302
    assert meta.location.startswith(server.cdn_url)
    assert meta.etag and len(meta.etag) == 64  # X-Linked-Etag: the LFS sha256 stand-in


def test_hub_error_codes_map_to_huggingface_hub_errors(served):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    server, _ = served
    kw = {"endpoint": server.url, "cache_dir": str(hub_cache_dir())}  # never the user's real cache
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "config.json", **kw)
    assert hf_hub_download("org/gated", "config.json", token="hf_ok", **kw)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("org/tiny", "config.json", revision="nope", **kw)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/tiny", "missing.json", **kw)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/none", "config.json", **kw)


def test_ranges_are_inclusive_and_single(served):
    from huggingface_hub.utils import get_session

    server, root = served
    url = f"{server.url}/org/tiny/resolve/main/config.json"
    data = (root / "config.json").read_bytes()
    r = get_session().get(url, headers={"Range": "bytes=0-9"})
    assert r.status_code == 206 and r.content == data[:10]
    assert r.headers["Content-Range"] == f"bytes 0-9/{len(data)}"
    r = get_session().get(url, headers={"Range": f"bytes=5-{len(data) + 100}"})  # clamped to the file
    assert r.status_code == 206 and r.content == data[5:]
    assert get_session().get(url, headers={"Range": f"bytes={len(data)}-"}).status_code == 416
    assert get_session().get(url, headers={"Range": "bytes=0-1,4-5"}).status_code == 400


def test_model_info_retries_5xx_then_gives_one_line(served, monkeypatch):
    server, _ = served
    monkeypatch.setattr(hub_client, "DEFAULT_BACKOFF_S", 0.01)
    server.add_fault("5xx", path_contains="/api/models/", times=1)
    raw = open_hub("org/tiny", endpoint=server.url, progress=False)
    assert raw.stats["retries"] == 1
    server.add_fault("5xx", path_contains="/api/models/")
    with pytest.raises(NetworkError) as err:
        open_hub("org/tiny", endpoint=server.url, progress=False)
    assert str(err.value) == "org/tiny: HTTP 503 reading repo info"
