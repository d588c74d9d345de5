"""Every source returns a complete, eager RawCheckpoint (sources/interface.py ``Source``): plain dicts already
read, the same fields filled whatever the kind, and the index parsed and summarized exactly once per report.

The four safetensors kinds read one repo: a local directory, the Hub (the test Hub server), the HF cache
filled by huggingface_hub's own ``snapshot_download`` from that server, and a metadata snapshot.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

import ckptinspect  # noqa: E402
import ckptinspect.api  # noqa: E402,F401
import ckptinspect.header.index as index_format  # noqa: E402
import ckptinspect.json_text as json_text  # noqa: E402
import ckptinspect.pipeline  # noqa: E402,F401
import ckptinspect.sources.hf_cache  # noqa: E402,F401
import ckptinspect.sources.hub  # noqa: E402,F401
import ckptinspect.sources.local  # noqa: E402,F401
from ckptinspect.settings import Settings  # noqa: E402
import ckptinspect.sources.snapshot  # noqa: E402,F401
from ckptinspect.header.index import INDEX  # noqa: E402
from ckptinspect.pipeline import report_from_raw  # noqa: E402
from ckptinspect.sources import open_source, source_kinds  # noqa: E402
from ckptinspect.sources.hf_cache import hub_cache_dir  # noqa: E402
from ckptinspect.sources.snapshot import write_snapshot  # noqa: E402

REPO = "org/eager"


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    """(local directory, the running test Hub server serving it as REPO) in a temporary HF_HOME."""
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=3, experts=4)
    with HubServer() as server:
        server.add_repo(REPO, root)
        monkeypatch.setenv("HF_ENDPOINT", server.url)  # what ckptinspect.api reads (below it: settings=)
        yield root, server


def _count_calls(monkeypatch, func):
    """Replace ``func`` everywhere ckptinspect holds it (modules import it by name); the sources it was
    called for, in order."""
    calls: list[str] = []

    def counted(*args, **kwargs):
        calls.append(kwargs.get("source", ""))
        return func(*args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("ckptinspect") and m is not None]:
        for attr, value in list(vars(module).items()):
            if value is func:
                monkeypatch.setattr(module, attr, counted)
    return calls


def _every_kind(root: Path, server: HubServer, tmp_path: Path) -> dict:
    from huggingface_hub import snapshot_download

    hub = Settings(endpoint=server.url)
    records = {"local": open_source(str(root), progress=False), "hub": open_source(REPO, progress=False, settings=hub)}
    snapshot_download(REPO, endpoint=server.url, cache_dir=str(hub_cache_dir()))
    records["hf-cache"] = open_source(REPO, progress=False)
    write_snapshot(records["local"], tmp_path / "meta.json.gz")
    records["snapshot"] = open_source(str(tmp_path / "meta.json.gz"), progress=False)
    return records


def test_every_source_fills_the_same_fields_with_plain_data(repo, tmp_path):
    root, server = repo
    records = _every_kind(root, server, tmp_path)
    assert {kind: raw.kind for kind, raw in records.items()} == {k: k for k in records}
    local = records["local"]
    for kind, raw in records.items():
        assert type(raw.json_files) is dict and type(raw.headers) is dict and type(raw.file_sizes) is dict, kind
        assert all(type(h) is bytes for h in raw.headers.values()), kind
        assert raw.index_summary is not None and raw.index_summary.shards == tuple(raw.headers), kind
        assert list(raw.file_sizes) == list(raw.headers), kind
        # the same answers whatever the kind: a consumer never needs to know where a record came from
        assert raw.headers == local.headers and raw.file_sizes == local.file_sizes, kind
        assert raw.index_summary == local.index_summary, kind
        assert raw.json_files["config.json"] == local.json_files["config.json"], kind
        assert raw.json_files[INDEX] == local.json_files[INDEX], kind


def test_a_local_record_needs_no_disk_once_opened(repo, tmp_path):
    """Eager: the directory can vanish after open_source and the whole report still comes out the same."""
    root, _ = repo
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    expected = report_from_raw(open_source(str(root), progress=False))
    raw = open_source(str(copy), progress=False)
    shutil.rmtree(copy)
    report = report_from_raw(raw)
    assert report.checkpoint.inventory == expected.checkpoint.inventory
    assert report.checkpoint.findings == expected.checkpoint.findings and report.mtp == expected.mtp


@pytest.mark.parametrize("kind", ["local", "hub", "hub-again", "hf-cache", "snapshot"])
def test_the_index_is_parsed_and_summarized_once_per_report(repo, tmp_path, monkeypatch, kind):
    """One report: one summary (header/index.py) and at most one JSON parse of the index (none for a
    snapshot, whose index came inside the snapshot document). ``hub-again``: the first Hub run left the
    JSON files in the HF cache but no shard, so the cache is not complete; learning that must not parse
    the 41 MB-class index on top of the Hub read's own parse."""
    root, server = repo
    ref = {"local": str(root), "snapshot": str(tmp_path / "meta.json.gz")}.get(kind, REPO)
    if kind == "snapshot":
        write_snapshot(open_source(str(root), progress=False), tmp_path / "meta.json.gz")
    if kind == "hub-again":
        ckptinspect.api.inspect(REPO)
        assert (hub_cache_dir() / "models--org--eager").is_dir()
    if kind == "hf-cache":
        from huggingface_hub import snapshot_download

        snapshot_download(REPO, endpoint=server.url, cache_dir=str(hub_cache_dir()))
    summaries = _count_calls(monkeypatch, index_format.summarize_index)
    # an index is decoded by decode_index_json, which hands a document it cannot type to decode_json
    parses = _count_calls(monkeypatch, json_text.decode_json)
    index_decodes = _count_calls(monkeypatch, json_text.decode_index_json)
    report = ckptinspect.api.inspect(ref)
    assert report.checkpoint.kind == {"hub-again": "hub"}.get(kind, kind)
    assert len(summaries) == 1, summaries
    assert not [s for s in parses if s.endswith(INDEX)], parses  # the typed decode took this index
    index_parses = [s for s in index_decodes if s.endswith(INDEX)]
    assert len(index_parses) == (0 if kind == "snapshot" else 1), index_decodes


def test_the_registry_order_is_data():
    names = [kind.name for kind in source_kinds()]
    assert names[-6:] == ["gguf-local", "local", "snapshot", "gguf-hub", "hf-cache", "hub"]


def test_cached_repo_files_is_huggingface_hubs_view_of_the_cache(repo):
    """After a Hub read the cache holds the JSON files (no shard): cached_repo_files lists them through
    scan_cache_dir, the same names huggingface_hub's own scan reports; a missing blob is its 'corrupted'."""
    from huggingface_hub import scan_cache_dir

    from ckptinspect.sources.hf_cache import cached_repo_files

    assert cached_repo_files(REPO) == []  # no cache directory yet
    ckptinspect.api.inspect(REPO)
    names = cached_repo_files(REPO)
    assert names == ["config.json", "generation_config.json", INDEX]
    (repo_info,) = [r for r in scan_cache_dir(hub_cache_dir()).repos if r.repo_id == REPO]
    assert sorted(f.file_name for rev in repo_info.revisions for f in rev.files) == names
    assert ckptinspect.api.cached_files(REPO)[2] == names
    for blob in (hub_cache_dir() / "models--org--eager" / "blobs").iterdir():
        blob.unlink()
    assert cached_repo_files(REPO) == []


def test_an_eager_local_read_is_bounded_as_a_whole(repo, monkeypatch):
    """Every header is read before the scan, so the headers together have a cap: the shard that would pass
    it is refused (one line naming it) before its header is read."""
    from ckptinspect.errors import HeaderError
    from ckptinspect.sources import interface

    root, _ = repo
    headers = open_source(str(root), progress=False).headers
    first, second, third = headers
    monkeypatch.setattr(interface, "MAX_TOTAL_HEADER_BYTES", len(headers[first]) + len(headers[second]) + 1)
    with pytest.raises(HeaderError) as err:
        open_source(str(root), progress=False)
    assert str(err.value).startswith(f"{third}: the shard headers add up to over the ") and "\n" not in str(err.value)
    monkeypatch.setattr(interface, "MAX_TOTAL_HEADER_BYTES", sum(map(len, headers.values())))
    assert open_source(str(root), progress=False).headers == headers  # exactly at the cap: read
