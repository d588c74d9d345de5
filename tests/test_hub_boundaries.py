"""Header sizes around the 100,000-byte first range (huggingface/huggingface_hub#4602) and the 25 MB cap.

The first range is forced to huggingface_hub's ``bytes=0-100000`` (100,001 bytes, inclusive), so exactly the
headers of N <= 99,993 bytes fit in one response; the rest need one more range for the remainder.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, names_for_header, write_safetensors  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import HeaderError  # noqa: E402
from ckptinspect.sources import header_ranges  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")


@pytest.mark.parametrize("n", [99_992, 99_993, 99_994, 99_999, 100_000, 100_001])
def test_header_at_the_100kb_range_boundary(tmp_path, monkeypatch, n):
    root = tmp_path / "repo"
    header = write_safetensors(root / "model.safetensors", names_for_header(n), header_len=n)
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    assert len(header) == n
    monkeypatch.setattr(header_ranges, "DEFAULT_FIRST_RANGE", 100_001)  # bytes=0-100000, as huggingface_hub asks
    with HubServer(redirect_lfs=False) as server:
        server.add_repo("org/b", root)
        raw = open_hub("org/b", endpoint=server.url, progress=False)
        ranges = [e[2] for e in server.stats()["log"] if e[1].endswith("model.safetensors")]
    assert raw.headers["model.safetensors"] == header
    json.loads(raw.headers["model.safetensors"])  # complete, parseable JSON
    if n <= 100_001 - 8:  # 99,993 header bytes follow the prefix in a full first answer
        assert ranges == ["bytes=0-100000"]
    else:
        assert ranges == ["bytes=0-100000", f"bytes=100001-{n + 7}"]


@pytest.mark.parametrize("n", [99_993, 99_994, 100_000])
def test_predicted_range_covers_boundary_headers_in_one_request(tmp_path, n):
    """With an index, the first range is sized from the tensor names: one GET whatever N is."""
    root = tmp_path / "repo"
    names = names_for_header(n)
    shards = {}
    for i in range(3):
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        shard_names = [name.replace("layers.0.", f"layers.{i}.") for name in names]
        shards[shard] = write_safetensors(root / shard, shard_names, header_len=n)
    weight_map = {name: s for s, h in shards.items() for name in json.loads(h) if name != "__metadata__"}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text("{}")
    with HubServer() as server:
        server.add_repo("org/b", root)
        raw = open_hub("org/b", endpoint=server.url, progress=False)
    assert dict(raw.headers) == shards
    assert raw.stats["extra_requests"] == 0


def test_header_over_the_cap_is_refused_before_downloading(tmp_path):
    """The Hub's cap is a local read's (issue 34: one message for one corrupt header, wherever it is read)."""
    root = tmp_path / "repo"
    root.mkdir()
    n = header_ranges.MAX_HEADER_LENGTH + 1
    with open(root / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", n) + b'{"a":')
        fh.truncate(8 + n + 16)  # sparse: a real 100 MB header region the reader must not fetch
    (root / "config.json").write_text("{}")
    with HubServer() as server:
        server.add_repo("org/huge", root)
        with pytest.raises(HeaderError) as err:
            open_hub("org/huge", endpoint=server.url, progress=False)
        sent = sum(e[4] for e in server.stats()["log"] if e[1].endswith("model.safetensors"))
    assert "100,000,001" in str(err.value) and "org/huge/model.safetensors" in str(err.value)
    assert sent <= header_ranges.DEFAULT_FIRST_RANGE


def test_header_length_past_end_of_file(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", 5000) + b'{"x":1}')
    (root / "config.json").write_text("{}")
    with HubServer() as server:
        server.add_repo("org/trunc", root)
        with pytest.raises(HeaderError) as err:
            open_hub("org/trunc", endpoint=server.url, progress=False)
    assert "past the end" in str(err.value) and "org/trunc/model.safetensors" in str(err.value)
