"""Resource exhaustion through legal-looking metadata, within the byte caps (issue 26, hostile round 3):
caps that bound memory (values, not only bytes), exclude lists of 100,000 entries handled in linear time
with nothing from RE2 on stderr, a weight_map value with a trailing slash refused. Timings of the same
cases: BENCHMARKS.md ("Hostile inputs at scale")."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptinspect.json_text import MAX_JSON_ITEMS, decode_json
from ckptinspect.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _report(model: Path | str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"}
    return subprocess.run([sys.executable, "-m", "ckptinspect", "report", str(model), "-q", *extra],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def _copy(make_fixture, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(make_fixture(name), dst)
    return dst


def test_json_value_cap_is_checked_before_parsing():
    """`[[],[],...]` builds a 56-byte list per 3 bytes: refused by counting, before anything is built."""
    body = b"[" + b"[]," * (MAX_JSON_ITEMS // 2) + b"[]]"
    with pytest.raises(ConfigError, match="JSON values, over the"):
        decode_json(body, source="x.json")
    assert decode_json(b'{"a": [1, 2, {"b": []}]}', source="x.json") == {"a": [1, 2, {"b": []}]}


def test_an_index_of_millions_of_tiny_values_is_one_error_line(tmp_path, make_fixture):
    model = _copy(make_fixture, "deepseek_v3_nvfp4", tmp_path)
    index = model / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    text = json.dumps(doc)[:-1] + ', "pad": [' + "[]," * (MAX_JSON_ITEMS // 2) + "[]]}"
    index.write_text(text)
    r = _report(model)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-500:]
    assert "model.safetensors.index.json" in r.stderr and "JSON values" in r.stderr


def test_a_small_gzip_snapshot_of_millions_of_values_is_refused(tmp_path):
    from ckptinspect.sources.snapshot import MAX_SNAPSHOT_ITEMS

    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{"format":"ckptinspect-snapshot","format_version":1,"files":[],"json_files":{},'
                 b'"file_sizes":{},"source":{},"shards":[],"headers":{},"pad":[')
        fh.write(b"[]," * (MAX_SNAPSHOT_ITEMS // 2 + 1) + b"[]]}")
    assert path.stat().st_size < 1024 * 1024
    r = _report(path)
    assert r.returncode == 2 and "JSON values" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_weight_map_value_with_a_trailing_slash_is_refused(tmp_path, make_fixture):
    model = _copy(make_fixture, "deepseek_v3_nvfp4", tmp_path)
    index = model / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = next(iter(doc["weight_map"]))
    doc["weight_map"][first] += "/"
    index.write_text(json.dumps(doc))
    r = _report(model)
    assert r.returncode == 2 and "ends with a slash" in r.stderr, r.stderr[-500:]


def _many_globs(model: Path, n: int) -> None:
    path = model / "hf_quant_config.json"
    doc = json.loads(path.read_text())
    doc["quantization"]["exclude_modules"] += [f"model.layers.{i}.mlp.experts.*.x{i}_proj*" for i in range(n)]
    path.write_text(json.dumps(doc))


def test_many_exclude_globs_compile_in_bounded_chunks_and_print_nothing(tmp_path, make_fixture, monkeypatch):
    """20,000 wildcard globs: RE2 programs of at most UNION_CHUNK entries (old: one union that overflowed
    RE2, which logged to stderr, then one compilation per entry), the entries past MAX_PATTERN_ENTRIES an
    error finding (never guessed)."""
    import math

    from ckptinspect.quant import declared as declared_mod

    model = _copy(make_fixture, "deepseek_v3_nvfp4", tmp_path)
    _many_globs(model, 20_000)
    r = _report(model, "--format", "json")
    assert r.returncode == 0 and r.stderr == "", r.stderr[:500]
    codes = {f["code"]: f for f in json.loads(r.stdout)["findings"]}
    assert codes["exclude-list-too-long"]["severity"] == "error"
    assert "10,001 wildcard" in codes["exclude-list-too-long"]["message"]  # 20,000 + the fixture's model.layers.3*

    compiled = []
    real = declared_mod.compile_re2
    monkeypatch.setattr(declared_mod, "compile_re2", lambda p: compiled.append(p) or real(p))
    declared_mod._MATCHERS.clear()
    from ckptinspect.pipeline import build_report

    report = build_report(str(model), progress=False)
    assert len(compiled) <= math.ceil(declared_mod.MAX_PATTERN_ENTRIES / declared_mod.UNION_CHUNK) + 2
    assert any(f.code == "exclude-list-too-long" for f in report.checkpoint.findings)


def test_many_glob_entries_keep_the_matcher_answers(make_fixture, tmp_path):
    """Chunked programs and literal entries as a set answer as the old single union did: the fixture's own
    entries still exclude what they excluded."""
    from ckptinspect.pipeline import build_report

    plain = build_report(str(make_fixture("deepseek_v3_nvfp4")), progress=False)
    model = _copy(make_fixture, "deepseek_v3_nvfp4", tmp_path)
    _many_globs(model, 600)  # three chunks, under the cap
    crowded = build_report(str(model), progress=False)
    assert plain.mtp.verdicts == crowded.mtp.verdicts
    assert not any(f.code == "exclude-list-too-long" for f in crowded.checkpoint.findings)
