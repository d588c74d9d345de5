"""GGUF sources: local file / split set / directory of quants, the HF cache, and the Hub over ranges.

The Hub test runs huggingface_hub's own client against tests/hub_server.py (a real HTTP server on
127.0.0.1) and checks two things the issue requires: only headers are read (bytes received within
1.05x the header bytes, plus the one repo-info answer) and the answer equals the local path's.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import HeaderError, NotFoundError  # noqa: E402
from ckptinspect.settings import Settings  # noqa: E402
from ckptinspect.sources import open_source  # noqa: E402
from ckptinspect.sources.gguf_files import RawGguf, is_companion, model_sets  # noqa: E402
from fixtures.gguf_models import MODELS, write_model  # noqa: E402

pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")


@pytest.fixture(scope="module")
def quants(tmp_path_factory):
    """One repo-like directory holding two quants (one split), a companion head and a projector."""
    root = tmp_path_factory.mktemp("repo")
    write_model(replace(MODELS["GLM-4.5-Air-Q4_K_M"], vocab=8192), root)
    write_model(MODELS["GLM-4.5-Air-Q8_0"], root / "Q8_0")
    write_model(replace(MODELS["GLM-4.5-Air-trunk-Q4_K_M"], name="GLM-4.5-Air-trunk-IQ4_XS"), root / "trunk")
    (root / "mmproj-F16.gguf").write_bytes((root / "GLM-4.5-Air-Q4_K_M.gguf").read_bytes()[:4096])
    (root / "README.md").write_text("# tiny\n")
    return root


def _summary(raw: RawGguf) -> list:
    return [(name, h.metadata_items if hasattr(h, "metadata_items") else dict(h.metadata), h.tensors)
            for name, h in raw.parts + raw.companions]


def test_names_sort_into_sets_heads_and_projectors():
    names = ["a/M-Q4-00001-of-00002.gguf", "a/M-Q4-00002-of-00002.gguf", "a/mtp-M-Q8_0.gguf",
             "MTP/M-Q4_0-MTP.gguf", "mmproj-M-F16.gguf", "M-Q8_0.gguf", "README.md"]
    assert model_sets(names) == {"M-Q8_0": ["M-Q8_0.gguf"],
                                 "a/M-Q4": ["a/M-Q4-00001-of-00002.gguf", "a/M-Q4-00002-of-00002.gguf"]}
    assert [n for n in names if is_companion(n)] == ["a/mtp-M-Q8_0.gguf", "MTP/M-Q4_0-MTP.gguf"]
    assert model_sets(["Qwen3.6-27B-MTP-Q4_K_M.gguf"]) == {"Qwen3.6-27B-MTP-Q4_K_M": ["Qwen3.6-27B-MTP-Q4_K_M.gguf"]}


def test_a_directory_of_several_quants_needs_a_tag(quants):
    with pytest.raises(NotFoundError, match="holds 3 GGUF models; pick one with :TAG"):
        open_source(str(quants), progress=False)
    raw = open_source(f"{quants}:Q8_0", progress=False)
    assert raw.model == "Q8_0/GLM-4.5-Air-Q8_0" and len(raw.parts) == 3 and raw.companions == ()
    with pytest.raises(NotFoundError, match="no GGUF model matches :Q5_K_M"):
        open_source(f"{quants}:Q5_K_M", progress=False)


def test_a_named_file_brings_its_split_siblings_and_companions(quants):
    raw = open_source(str(quants / "Q8_0" / "GLM-4.5-Air-Q8_0-00002-of-00003.gguf"), progress=False)
    assert [n for n, _ in raw.parts] == [f"GLM-4.5-Air-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    trunk = open_source(str(quants / "trunk" / "GLM-4.5-Air-trunk-IQ4_XS.gguf"), progress=False)
    assert [n for n, _ in trunk.companions] == ["mtp-GLM-4.5-Air-trunk-Q8_0.gguf"]
    assert all(t.name.startswith("blk.3.") for t in trunk.companions[0][1].tensors)


def test_a_split_set_missing_a_part_is_one_error(quants, tmp_path):
    split = tmp_path / "split"
    shutil.copytree(quants / "Q8_0", split)
    (split / "GLM-4.5-Air-Q8_0-00002-of-00003.gguf").unlink()
    with pytest.raises(NotFoundError, match=r"split set has 2 of 3 parts \(missing part\(s\) 00002\)"):
        open_source(str(split), progress=False)


def test_a_corrupt_part_names_the_file(quants, tmp_path):
    split = tmp_path / "split"
    shutil.copytree(quants / "Q8_0", split)
    victim = split / "GLM-4.5-Air-Q8_0-00003-of-00003.gguf"
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(HeaderError, match="GLM-4.5-Air-Q8_0-00003-of-00003.gguf: truncated GGUF header"):
        open_source(str(split), progress=False)


def test_hf_cache_snapshot_is_read_without_network(quants, tmp_path, monkeypatch):
    storage = tmp_path / "hf_home" / "hub" / "models--org--GLM-4.5-Air-GGUF"
    commit = "c" * 40
    shutil.copytree(quants / "Q8_0", storage / "snapshots" / commit)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
    raw = open_source("org/GLM-4.5-Air-GGUF", progress=False)
    assert raw.kind == "hf-cache" and len(raw.parts) == 3
    assert _summary(raw) == _summary(open_source(str(quants / "Q8_0"), progress=False))


def test_hub_reads_headers_only_and_agrees_with_the_local_path(quants):
    with HubServer() as server:
        server.add_repo("org/GLM-4.5-Air-GGUF", quants)
        raw = open_source("org/GLM-4.5-Air-GGUF:Q4_K_M", progress=False, settings=Settings(endpoint=server.url))
        stats = server.stats()
    local = open_source(f"{quants}:Q4_K_M", progress=False)
    assert raw.kind == "hub" and raw.model == local.model == "GLM-4.5-Air-Q4_K_M"
    assert _summary(raw) == _summary(local)
    header_bytes = sum(h.header_bytes for _, h in raw.parts)
    assert header_bytes > 100_000  # an 8k-token vocabulary: several range extensions
    info_bytes = sum(e[4] for e in stats["log"] if "/api/models/" in e[1])
    range_bytes = sum(e[4] for e in stats["log"] if "/api/models/" not in e[1])
    assert range_bytes == raw.stats["bytes_received"]
    assert header_bytes <= range_bytes <= 1.05 * header_bytes
    assert stats["bytes"] <= 1.05 * header_bytes + info_bytes
    assert all(e[2] for e in stats["log"] if "/api/models/" not in e[1])  # every file read is a Range request
    # the short keys after the vocabulary come in a few extensions, not one request per key
    assert len([e for e in stats["log"] if e[3] == 206]) <= 8


def test_hub_repo_without_the_tag_lists_the_quants(quants):
    with HubServer() as server:
        server.add_repo("org/GLM-4.5-Air-GGUF", quants)
        with pytest.raises(NotFoundError, match="holds 3 GGUF models"):
            open_source("org/GLM-4.5-Air-GGUF", progress=False, settings=Settings(endpoint=server.url))
        with pytest.raises(NotFoundError, match="org/missing-GGUF: repo not found"):
            open_source("org/missing-GGUF", progress=False, settings=Settings(endpoint=server.url))


def test_hub_reads_a_tokenizer_over_8_mib_in_a_few_ranges(tmp_path):
    """The tokenizer comes first and can exceed 8 MiB: the reader extends from the current offset, sized
    from the strings seen so far, so a few requests cover it and little past the header is received."""
    tokens = [f"token-{i:08d}-with-a-longer-tail" for i in range(280_000)]  # ~10 MB: fewer, longer strings write faster
    model = replace(MODELS["GLM-4.5-Air-Q4_K_M"], name="BigVocab-Q4_K_M",
                    extra_kv={"tokenizer.ggml.tokens": ("strs", tokens)})
    root = tmp_path / "big"
    write_model(model, root)
    with HubServer() as server:
        server.add_repo("org/BigVocab-GGUF", root)
        raw = open_source("org/BigVocab-GGUF", progress=False, settings=Settings(endpoint=server.url))
        stats = server.stats()
    header_bytes = raw.parts[0][1].header_bytes
    assert header_bytes > 8 * 1024 * 1024
    assert raw.parts[0][1].metadata["tokenizer.ggml.tokens"].count == 280_000
    ranges = [e for e in stats["log"] if "/api/models/" not in e[1] and e[3] == 206]
    assert 2 <= len(ranges) <= 8
    assert header_bytes <= raw.stats["bytes_received"] <= 1.05 * header_bytes
    assert _summary(raw) == _summary(open_source(str(root), progress=False))


def test_a_cache_holding_another_quant_falls_back_to_the_hub(quants, tmp_path, monkeypatch):
    storage = tmp_path / "hf_home" / "hub" / "models--org--GLM-4.5-Air-GGUF"
    with HubServer() as server:
        server.add_repo("org/GLM-4.5-Air-GGUF", quants)
        commit = server._repos["org/GLM-4.5-Air-GGUF"].commits["main"]
        shutil.copytree(quants / "Q8_0", storage / "snapshots" / commit / "Q8_0")
        (storage / "refs").mkdir()
        (storage / "refs" / "main").write_text(commit)
        hub = Settings(endpoint=server.url)
        assert open_source("org/GLM-4.5-Air-GGUF:Q8_0", progress=False, settings=hub).kind == "hf-cache"
        assert open_source("org/GLM-4.5-Air-GGUF:Q4_K_M", progress=False, settings=hub).kind == "hub"
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
        with pytest.raises(NotFoundError, match="no GGUF model matches :Q4_K_M"):
            open_source("org/GLM-4.5-Air-GGUF:Q4_K_M", progress=False, settings=hub)


@pytest.mark.parametrize("kind, outcome", [("5xx", "retried"), ("ignore-range", "refused"), ("wrong-range", "refused")])
def test_hub_faults_are_retried_or_refused_in_one_line(quants, monkeypatch, kind, outcome):
    from ckptinspect.errors import SourceError

    with HubServer() as server:
        server.add_repo("org/GLM-4.5-Air-GGUF", quants)
        server.add_fault(kind, path_contains=".gguf", times=1)
        if outcome == "retried":
            raw = open_source("org/GLM-4.5-Air-GGUF:Q4_K_M", progress=False, settings=Settings(endpoint=server.url))
            assert _summary(raw) == _summary(open_source(f"{quants}:Q4_K_M", progress=False))
            return
        with pytest.raises(SourceError) as err:
            open_source("org/GLM-4.5-Air-GGUF:Q4_K_M", progress=False, settings=Settings(endpoint=server.url))
        message = str(err.value)
        assert "GLM-4.5-Air-Q4_K_M.gguf" in message and "\n" not in message
        # a 200 answer is closed unread (tensor data is never downloaded); a shifted range is not used
        assert ("ranges are required" in message) if kind == "ignore-range" else ("got 'bytes 8-" in message)


def test_a_missing_gguf_path_is_not_taken_for_a_repo_id(tmp_path):
    with pytest.raises(NotFoundError, match="no such GGUF file"):
        open_source("models/GLM-4.5-Air-Q4_K_M.gguf", progress=False)
    fifo = tmp_path / "pipe.gguf"
    import os

    os.mkfifo(fifo)
    with pytest.raises(NotFoundError):  # never opened: a FIFO would block a reader
        open_source(str(fifo), progress=False)


def test_companions_are_found_nearest_first():
    from ckptinspect.sources.gguf_files import companions_for

    names = ["UD-Q4_K_XL/M-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL/M-UD-Q4_K_XL-00002-of-00002.gguf",
             "mtp-M-shared-Q8_0.gguf", "UD-Q4_K_XL/mtp-M-shared-Q4_K_M.gguf", "MTP/M-Q4_0-MTP.gguf",
             "Q8_0/mtp-M-Q8_0.gguf"]
    assert companions_for(names, "UD-Q4_K_XL/M-UD-Q4_K_XL") == [
        "UD-Q4_K_XL/mtp-M-shared-Q4_K_M.gguf", "mtp-M-shared-Q8_0.gguf", "MTP/M-Q4_0-MTP.gguf"]


def test_hub_report_equals_the_local_report(quants, monkeypatch):
    from ckptinspect.pipeline import build_report
    from ckptinspect.render.json_out import report_to_json, validate_report_json

    with HubServer() as server:
        server.add_repo("org/GLM-4.5-Air-GGUF", quants)
        hub = report_to_json(build_report("org/GLM-4.5-Air-GGUF:trunk", progress=False,
                                          settings=Settings(endpoint=server.url)))
    local = report_to_json(build_report(f"{quants}:trunk", progress=False))
    validate_report_json(hub)
    assert hub["mtp"]["verdict"] == {"llamacpp": "ready"}
    assert hub["mtp"]["engines"]["llamacpp"]["reasons"] == ["gguf-mtp-head-companion"]
    for doc in (hub, local):
        doc.pop("source")
    assert hub == local
