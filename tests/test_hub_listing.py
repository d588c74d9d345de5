"""The test Hub server's listing (tests/hub_listing.py) against huggingface_hub's own client: what
``HfApi.list_models`` sends (filter, author, search, limit, expand) and how it follows ``Link`` pages,
and ``HfApi.model_info(expand=...)``. The audit's selection (ckptinspect/audit/select.py) goes through
exactly these calls, so a server that answered differently from the Hub would show here first."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

BASE = "base-org/Base-7B"
QUANT_TAG = f"base_model:quantized:{BASE}"


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")


@pytest.fixture()
def server(tmp_path):
    root = tmp_path / "repo"
    make_sharded_repo(root, shards=1, experts=2)
    with HubServer() as srv:
        for i in range(7):  # 7 quants of BASE by two owners, plus unrelated repos
            owner = "alpha" if i % 2 == 0 else "Beta"
            srv.add_repo(f"{owner}/Base-7B-q{i}", root, tags=(QUANT_TAG, "safetensors"))
        srv.add_repo("alpha/Other-3B", root, tags=("base_model:quantized:x/Other",))
        srv.add_repo("gamma/Base-7B-finetune", root, tags=(f"base_model:finetune:{BASE}",))
        srv.listing_page_size = 3
        yield srv


def _api(server):
    from huggingface_hub import HfApi

    return HfApi(endpoint=server.url)


def _listing_requests(server):
    return [e for e in server.stats()["log"] if urlsplit(e[1]).path == "/api/models"]


def test_filter_pages_through_link_headers_with_the_real_client(server):
    server.reset_stats()
    models = list(_api(server).list_models(filter=QUANT_TAG, expand=["sha", "siblings"]))
    assert sorted(m.id for m in models) == sorted(f"{'alpha' if i % 2 == 0 else 'Beta'}/Base-7B-q{i}"
                                                  for i in range(7))
    for m in models:  # the commit and file list come with the listing
        assert m.sha == server._repos[m.id].commits["main"]
        assert {s.rfilename for s in m.siblings} >= {"config.json", "model.safetensors.index.json"}
        assert m.downloads is None  # not expanded: not sent
    requests = _listing_requests(server)
    assert len(requests) == 3  # 7 entries, 3 a page: the client followed two rel="next" links
    first = parse_qs(urlsplit(requests[0][1]).query)
    assert first["filter"] == [QUANT_TAG] and first["expand"] == ["sha", "siblings"] and "cursor" not in first
    assert all("cursor" in parse_qs(urlsplit(r[1]).query) for r in requests[1:])


def test_author_search_and_limit_narrow_one_listing(server):
    api = _api(server)
    assert sorted(m.id for m in api.list_models(author="beta", filter=QUANT_TAG)) == \
        ["Beta/Base-7B-q1", "Beta/Base-7B-q3", "Beta/Base-7B-q5"]
    assert sorted(m.id for m in api.list_models(search="other")) == ["alpha/Other-3B"]
    assert sorted(m.id for m in api.list_models(search="base-7b", author="gamma")) == ["gamma/Base-7B-finetune"]
    server.reset_stats()
    assert len(list(api.list_models(filter=QUANT_TAG, limit=2))) == 2
    assert len(_listing_requests(server)) == 1  # limit: the client stops after the first page


def test_default_fields_without_expand_and_400_for_an_unknown_property(server):
    from huggingface_hub.errors import HfHubHTTPError

    api = _api(server)
    m = next(iter(api.list_models(search="Other")))
    assert m.tags == ["base_model:quantized:x/Other"] and m.sha is None and m.siblings is None
    with pytest.raises(HfHubHTTPError) as err:
        list(api.list_models(expand=["no-such-property"]))
    assert err.value.response.status_code == 400


def test_model_info_expand_returns_only_what_was_asked(server):
    api = _api(server)
    info = api.model_info("alpha/Base-7B-q0", expand=["sha"])
    assert info.sha == server._repos["alpha/Base-7B-q0"].commits["main"]
    assert info.siblings is None and info.tags is None
    full = api.model_info("alpha/Base-7B-q0")
    assert full.tags == [QUANT_TAG, "safetensors"] and full.siblings
