"""Hub source against a real HTTP server speaking the Hub protocol (tests/hub_server.py), with the real
huggingface_hub client (model_info, build_hf_headers, get_session, its cache layout). No internet."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo, write_safetensors  # noqa: E402
from hub_server import HubServer  # noqa: E402
from recording_progress import RecordingProgress  # noqa: E402

from ckptinspect.errors import AccessError, NotFoundError  # noqa: E402
from ckptinspect.sources import header_ranges  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")


@pytest.fixture()
def server():
    with HubServer() as srv:
        yield srv


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repos" / "tiny"
    headers = make_sharded_repo(root, shards=3, experts=16,
                                extra_json={"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4"}}})
    return root, headers


def test_sharded_repo_reads_exact_headers_with_one_request_per_shard(server, repo):
    root, headers = repo
    server.add_repo("org/tiny", root)
    raw = open_hub("org/tiny", endpoint=server.url, progress=False)

    assert raw.kind == "hub"
    assert dict(raw.headers) == headers  # byte-exact, padding included
    assert raw.revision == server._repos["org/tiny"].commits["main"]
    assert set(raw.json_files) == {"config.json", "hf_quant_config.json", "model.safetensors.index.json",
                                   "generation_config.json"}
    assert raw.json_files["config.json"]["model_type"] == "tiny_moe"
    assert "README.md" in raw.files
    for shard in headers:
        assert raw.file_sizes[shard] == (root / shard).stat().st_size
    # 1 model-info call + 4 JSON files + 1 GET per shard; each shard GET is redirected to the "CDN".
    assert raw.stats["extra_requests"] == 0
    assert raw.stats["requests"] == 1 + 4 + 3 + 3
    stats = server.stats()
    assert stats["by_method"] == {"GET": 1 + 4 + 3 + 3}
    header_total = sum(8 + len(h) for h in headers.values())
    json_total = sum((root / n).stat().st_size for n in raw.json_files)
    header_gets = sum(e[4] for e in stats["log"] if e[1].startswith("/cdn/"))
    # Every shard here is in the first wave (3 shards, 20 workers), asked for the first guess of 100 bytes per
    # entry beyond the name (header_ranges.FIRST_ENTRY_GUESS): ~1.3x this tiny repo's short entries.
    assert header_total <= header_gets <= 1.45 * header_total
    assert sum(e[4] for e in stats["log"] if "/resolve/" in e[1]) == json_total


def test_second_run_reads_json_from_hf_cache(server, repo, tmp_path):
    root, headers = repo
    server.add_repo("org/tiny", root)
    open_hub("org/tiny", endpoint=server.url, progress=False, header_cache=False)
    server.reset_stats()
    raw = open_hub("org/tiny", endpoint=server.url, progress=False, header_cache=False)
    assert raw.stats["json_from_cache"] == 4
    # huggingface_hub 2.x may also refresh its user-agent registry (/api/agent-harnesses) on its own.
    ours = [e for e in server.stats()["log"] if not e[1].startswith("/api/agent-harnesses")]
    assert len(ours) == 1 + 3 * 2, [e[:4] for e in ours]  # info + shard GETs (+ redirects), no JSON
    assert dict(raw.headers) == headers

    # The cache layout is huggingface_hub's own: its offline lookup finds the file we stored.
    from huggingface_hub import hf_hub_download

    path = hf_hub_download("org/tiny", "config.json", cache_dir=str(tmp_path / "hf_home" / "hub"),
                           local_files_only=True)
    assert json.loads(Path(path).read_text()) == raw.json_files["config.json"]


def test_short_prediction_asks_only_for_the_remainder(server, repo, monkeypatch):
    root, headers = repo
    server.add_repo("org/tiny", root)
    monkeypatch.setattr(header_ranges, "FIRST_ENTRY_GUESS", 5)
    monkeypatch.setattr(header_ranges, "ENTRY_MARGIN", -60)  # force every prediction short
    raw = open_hub("org/tiny", endpoint=server.url, progress=False)
    assert dict(raw.headers) == headers
    assert raw.stats["extra_requests"] == 3
    cdn = [e for e in server.stats()["log"] if e[1].startswith("/cdn/")]
    by_file: dict[str, list[str]] = {}
    for _, path, rng, _, _ in cdn:
        by_file.setdefault(path.rsplit("/", 1)[1], []).append(rng)
    for shard, ranges in by_file.items():
        # by start offset: the server logs after sending, so under load the second request can log first
        first, second = sorted(ranges, key=lambda r: int(r.split("=")[1].split("-")[0]))
        first_end = int(first.split("-")[1])
        start, end = (int(x) for x in second.split("=")[1].split("-"))
        assert start == first_end + 1  # no byte fetched twice
        assert end == 8 + len(headers[shard]) - 1  # and none past the header


def test_single_file_repo_without_index(server, tmp_path):
    root = tmp_path / "single"
    header = write_safetensors(root / "model.safetensors", [f"model.layers.{i}.mlp.weight" for i in range(40)])
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    server.add_repo("org/single", root)
    raw = open_hub("org/single", endpoint=server.url, progress=False)
    assert dict(raw.headers) == {"model.safetensors": header}
    assert raw.file_sizes["model.safetensors"] == (root / "model.safetensors").stat().st_size
    assert "model.safetensors.index.json" not in raw.json_files


def test_revision_is_pinned_to_its_commit(server, repo, tmp_path):
    root, _ = repo
    other = tmp_path / "repos" / "v2"
    other_headers = make_sharded_repo(other, shards=2, experts=4)
    server.add_repo("org/tiny", root, revisions={"v2": other})
    raw = open_hub("org/tiny", revision="v2", endpoint=server.url, progress=False)
    assert dict(raw.headers) == other_headers
    assert raw.revision == server._repos["org/tiny"].commits["v2"]
    assert all(f"/{raw.revision}/" in e[1] for e in server.stats()["log"] if "/resolve/" in e[1])


def test_endpoint_from_the_settings_else_huggingface_hub(server, repo, monkeypatch):
    """The settings' endpoint (HF_ENDPOINT as the CLI or the api read it), else huggingface_hub's own
    (constants.ENDPOINT: HF_ENDPOINT as huggingface_hub read it at import); never os.environ here."""
    from ckptinspect.settings import Settings

    root, headers = repo
    server.add_repo("org/tiny", root)
    assert dict(open_hub("org/tiny", progress=False, settings=Settings(endpoint=server.url)).headers) == headers
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", server.url)
    assert dict(open_hub("org/tiny", progress=False).headers) == headers


def test_gated_repo_needs_a_token(server, repo, monkeypatch):
    root, headers = repo
    server.add_repo("org/gated", root, gated_token="hf_secret")
    with pytest.raises(AccessError) as err:
        open_hub("org/gated", endpoint=server.url, progress=False)
    assert "org/gated" in str(err.value) and "token" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(AccessError):
        open_hub("org/gated", endpoint=server.url, token="hf_wrong", progress=False)
    raw = open_hub("org/gated", endpoint=server.url, token="hf_secret", progress=False)
    assert dict(raw.headers) == headers
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # huggingface_hub's own token lookup
    assert dict(open_hub("org/gated", endpoint=server.url, progress=False).headers) == headers


@pytest.mark.parametrize("ref,revision,needle", [
    ("org/missing", None, "repository not found"),
    ("org/tiny", "no-such-branch", "revision 'no-such-branch' not found"),
])
def test_missing_repo_or_revision(server, repo, ref, revision, needle):
    server.add_repo("org/tiny", repo[0])
    with pytest.raises(NotFoundError) as err:
        open_hub(ref, revision=revision, endpoint=server.url, progress=False)
    assert needle in str(err.value) and ref in str(err.value)


def test_index_naming_a_missing_shard(server, repo):
    root, _ = repo
    (root / "model-00002-of-00003.safetensors").unlink()
    server.add_repo("org/tiny", root)
    with pytest.raises(NotFoundError) as err:
        open_hub("org/tiny", endpoint=server.url, progress=False)
    assert "model-00002-of-00003.safetensors" in str(err.value)


def test_progress_covers_every_phase_of_the_read(server, repo, capsys):
    """Repo info, then the index, then headers 0/N .. N/N, then the line is ended; nothing on stdout."""
    server.add_repo("org/tiny", repo[0])
    recorder = RecordingProgress()
    raw = open_hub("org/tiny", endpoint=server.url, progress=recorder, header_cache=False)
    shards = len(raw.headers)
    assert shards == 3
    names = [name for name, _, _ in recorder.heard]
    assert names[:2] == ["repo info", "index"] and set(names[2:]) == {"headers"}
    counts = [(done, total) for name, done, total in recorder.heard if name == "headers"]
    assert counts == [(n, shards) for n in range(shards + 1)]
    assert recorder.ended == 1
    # True draws only on a terminal: pytest's captured stderr is not one, so nothing is written
    open_hub("org/tiny", endpoint=server.url, progress=True)
    open_hub("org/tiny", endpoint=server.url, progress=False)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_ends_when_the_read_fails(server, repo):
    root, _ = repo
    (root / "model-00002-of-00003.safetensors").unlink()
    server.add_repo("org/broken", root)
    recorder = RecordingProgress()
    with pytest.raises(NotFoundError):
        open_hub("org/broken", endpoint=server.url, progress=recorder)
    assert recorder.ended == 1 and recorder.heard[0][0] == "repo info"


def test_fewer_requests_than_get_safetensors_metadata(server, tmp_path):
    """Same server, same repo: headers over 100 kB cost huggingface_hub two GETs each, us one."""
    root = tmp_path / "big"
    make_sharded_repo(root, shards=4, layers_per_shard=4, experts=96)  # ~120 kB headers
    server.add_repo("org/big", root)
    from huggingface_hub import HfApi

    meta = HfApi(endpoint=server.url).get_safetensors_metadata("org/big")
    theirs = server.stats()["requests"]
    server.reset_stats()
    raw = open_hub("org/big", endpoint=server.url, progress=False)
    ours = server.stats()["requests"]
    assert set(raw.headers) == set(meta.files_metadata)
    assert all(len(h) > 100_000 for h in raw.headers.values())
    assert ours < theirs


def test_on_header_sees_every_header_once_as_it_arrives(server, repo):
    root, headers = repo
    server.add_repo("org/tiny", root)
    seen: list[tuple[str, bytes]] = []
    raw = open_hub("org/tiny", endpoint=server.url, progress=False, on_header=lambda s, h: seen.append((s, h)))
    assert sorted(seen) == sorted(headers.items())
    assert dict(raw.headers) == headers


def test_shard_names_needing_url_quoting(server, tmp_path):
    root = tmp_path / "odd"
    shard = "weights part #1.safetensors"
    header = write_safetensors(root / shard, ["model.norm.weight"])
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight": shard}}))
    (root / "config.json").write_text("{}")
    server.add_repo("org/odd", root)
    assert open_hub("org/odd", endpoint=server.url, progress=False).headers[shard] == header
