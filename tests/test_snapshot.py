"""Metadata snapshots (.json.gz): round trip, determinism, refusal to write into a model directory, bad
files, the `snapshot` command, and `report` on a snapshot equal to `report` on the original."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf, make_sharded_repo  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import ConfigError, NotFoundError, SourceError  # noqa: E402
from ckptinspect.records import RawCheckpoint  # noqa: E402
from ckptinspect.sources.snapshot import FORMAT_VERSION, read_snapshot, write_snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")


def _raw(headers: dict[str, bytes]) -> RawCheckpoint:
    return RawCheckpoint(ref="org/x", kind="hub", location="http://hub/org/x@abc", files=("config.json", *headers),
                         json_files={"config.json": {"model_type": "tiny", "unicode": "é"}}, headers=headers,
                         file_sizes={k: 1000 + i for i, k in enumerate(headers)}, revision="a" * 40,
                         stats={"requests": 3})


def test_round_trip_is_byte_exact(tmp_path):
    headers = {"a.safetensors": b'{"__metadata__":{"format":"pt"}}      ',  # padding kept
               "b.safetensors": b'{"x":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}',
               "c.safetensors": b'{"\xff\xfe": 1}'}  # not UTF-8: stored base64, the parser will reject it
    raw = _raw(headers)
    out = tmp_path / "snap.json.gz"
    write_snapshot(raw, out)
    back = read_snapshot(out)
    assert back.kind == "snapshot" and back.location == str(out)
    assert dict(back.headers) == headers
    assert back.files == raw.files and dict(back.file_sizes) == dict(raw.file_sizes)
    assert back.json_files == raw.json_files and back.revision == raw.revision
    assert back.stats["snapshot_of"]["ref"] == "org/x"
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["format_version"] == FORMAT_VERSION and "c.safetensors" in doc["headers_base64"]
    write_snapshot(back, tmp_path / "again.json.gz")  # a snapshot of a snapshot keeps the original source
    again = read_snapshot(tmp_path / "again.json.gz")
    assert again.stats["snapshot_of"]["kind"] == "hub" and dict(again.headers) == headers


def test_same_checkpoint_gives_identical_bytes(tmp_path):
    raw = _raw({"a.safetensors": b'{"a":{}}'})
    write_snapshot(raw, tmp_path / "1.json.gz")
    write_snapshot(raw, tmp_path / "2.json.gz")
    assert (tmp_path / "1.json.gz").read_bytes() == (tmp_path / "2.json.gz").read_bytes()


def test_refuses_to_write_into_the_model_directory(tmp_path):
    model = tmp_path / "model"
    make_sharded_repo(model, shards=1, experts=2)
    from ckptinspect.sources import open_source

    raw = open_source(str(model), progress=False)
    before = sorted(p.name for p in model.iterdir())
    with pytest.raises(SourceError) as err:
        write_snapshot(raw, model / "meta.json.gz")
    assert "model directory" in str(err.value)
    assert sorted(p.name for p in model.iterdir()) == before


@pytest.mark.parametrize("content,needle", [
    (b"not gzip at all", "not a gzip file"),
    (gzip.compress(b"[1, 2"), "not a JSON snapshot"),
    (gzip.compress(b'{"format": "something-else"}'), "not a ckptinspect snapshot"),
    (gzip.compress(b'{"format": "ckptinspect-snapshot", "format_version": 99}'), "format_version 99"),
    (gzip.compress(b'{"format": "ckptinspect-snapshot", "format_version": 1}'), "malformed field"),
], ids=["not-gzip", "not-json", "other-format", "future-version", "missing-fields"])
def test_bad_snapshot_files(tmp_path, content, needle):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        read_snapshot(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_missing_snapshot_file(tmp_path):
    with pytest.raises(NotFoundError):
        read_snapshot(tmp_path / "nope.json.gz")


def test_snapshot_command_from_the_hub_then_offline(tmp_path):
    """`ckptinspect snapshot org/name -o F` over HTTP ranges; the file alone then restores every header."""
    root = tmp_path / "repo"
    headers = make_sharded_repo(root, shards=3, experts=8)
    out = tmp_path / "out" / "tiny.json.gz"
    out.parent.mkdir()  # snapshot writes into an existing folder only (it never grows a directory tree)
    with HubServer() as server:
        server.add_repo("org/tiny", root)
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "cli_home"),
               "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "ckptinspect", "snapshot", "org/tiny", "-o", str(out),
                               "--verbose"], capture_output=True, text=True, env=env, timeout=120)
        served = server.stats()
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and "requests: " in proc.stderr
    # --verbose reports what the server saw, less huggingface_hub's own once-a-day agent-registry fetch
    ours = [e for e in served["log"] if not e[1].startswith("/api/agent-harnesses")]
    assert f"requests: {len(ours)}," in proc.stderr
    raw = read_snapshot(out)
    assert dict(raw.headers) == headers
    assert raw.stats["snapshot_of"]["kind"] == "hub"
    assert not list(root.glob("*.json.gz"))


def _report_json(ref: str, settings: object = None) -> dict:
    pipeline = pytest.importorskip("ckptinspect.pipeline", reason="ckptinspect.pipeline not written yet")
    from ckptinspect.render.json_out import report_to_json

    return report_to_json(pipeline.build_report(ref, progress=False, settings=settings))


def _strip_source(doc: object) -> object:
    """The report minus what names where it was read from (ref, kind, location, stats)."""
    if isinstance(doc, dict):
        return {k: _strip_source(v) for k, v in doc.items()
                if k not in {"source", "ref", "kind", "location", "stats", "timings", "generated_at"}}
    if isinstance(doc, list):
        return [_strip_source(v) for v in doc]
    return doc


def _fixture_or_tiny(tmp_path: Path) -> Path:
    """The shared Qwen3.5 NVFP4 fixture when fixtures/ builds, else a tiny repo written here."""
    try:
        from fixtures.generate import build_fixture

        return build_fixture("qwen3_5_moe_nvfp4", tmp_path / "fixtures")
    except Exception:  # noqa: BLE001 - the shared fixtures are another helper's work in progress
        model = tmp_path / "tiny"
        make_sharded_repo(model, shards=2, experts=4)
        return model


def test_report_on_snapshot_equals_report_on_original(tmp_path):
    model = _fixture_or_tiny(tmp_path)
    original = _report_json(str(model))
    from ckptinspect.sources import open_source

    out = tmp_path / "snap.json.gz"
    write_snapshot(open_source(str(model), progress=False), out)
    from_snapshot = _report_json(str(out))
    assert _strip_source(from_snapshot) == _strip_source(original)
    assert json.dumps(_strip_source(original))  # not vacuous: the report has content
    assert len(json.dumps(original)) > 500


def test_report_from_hub_equals_report_from_its_snapshot(tmp_path, monkeypatch):
    """The issue's promise: snapshot a Hub repo, then `report FILE.json.gz` offline gives the same report."""
    model = _fixture_or_tiny(tmp_path)
    out = tmp_path / "hub_snap.json.gz"
    with HubServer() as server:
        server.add_repo("org/fixture", model)
        from ckptinspect.settings import Settings
        from ckptinspect.sources import open_source

        hub = Settings(endpoint=server.url)
        from_hub = _report_json("org/fixture", hub)
        write_snapshot(open_source("org/fixture", progress=False, settings=hub), out)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # huggingface_hub reads it at import
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: offline for real
    assert _strip_source(_report_json(str(out))) == _strip_source(from_hub)
    assert _strip_source(from_hub) == _strip_source(_report_json(str(model)))
