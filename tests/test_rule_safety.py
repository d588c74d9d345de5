"""Hostile rule files: alias bombs, recursive aliases, deep nesting, huge files, FIFOs. Each fails fast with
a one-line RuleError naming the file; the validation cache holds only validated documents, under a cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ckptinspect.errors import RuleError
from ckptinspect.readiness.loader import ValidationCache, load_rules, read_rule_file
from ckptinspect.safe_yaml import MAX_DEPTH, MAX_RULE_FILE_BYTES, load_rule_yaml
from toy_inputs import TOY_FAMILY_RULE

REPO = Path(__file__).resolve().parent.parent
TOY = TOY_FAMILY_RULE


@pytest.fixture(autouse=True)
def private_rule_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTINSPECT_CACHE_DIR", str(tmp_path / "cache"))


def _exponential_bomb() -> str:
    """A few hundred bytes that expand to 9**9 leaves under a check's `when:`."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    body = yaml.safe_dump({k: v for k, v in TOY.items() if k != "engines"}, sort_keys=False)
    return body + "\n".join(lines) + "\nchecks:\n  - code: bomb\n    message: m\n    when: {any_of: *a9}\n"


BOMBS = {
    "exponential": _exponential_bomb(),
    "recursive": yaml.safe_dump(TOY, sort_keys=False) + "loop: &loop [*loop]\n",
    "merge": yaml.safe_dump(TOY, sort_keys=False) + "base: &b {x: 1}\nother: {<<: *b}\n",
}


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_alias_bombs_fail_fast_naming_the_file(tmp_path, kind):
    path = tmp_path / "user" / f"{kind}.yaml"
    path.parent.mkdir()
    path.write_text(BOMBS[kind])
    assert len(BOMBS[kind]) < 2000
    started = time.perf_counter()
    with pytest.raises(RuleError) as err:
        load_rules([path.parent])
    assert time.perf_counter() - started < 2.0
    message = str(err.value)
    assert message.startswith(str(path)) and ("anchors" in message or "aliases" in message)
    assert "\n" not in message
    cache = tmp_path / "cache" / "rules-validated.json"
    assert not cache.exists() or str(path) not in cache.read_text() and len(cache.read_bytes()) < 1_000_000


def test_rules_validate_cli_on_a_bomb_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMBS["exponential"])
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "rules", "validate", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "CKPTINSPECT_CACHE_DIR": str(tmp_path / "c")})
    assert time.perf_counter() - started < 20
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "anchors" in lines[0], proc.stderr


@pytest.mark.parametrize("depth,needle", [
    (500, f"nested deeper than {MAX_DEPTH} levels"),
    (200_000, "nest"),  # libyaml's own depth limit (1000) speaks first; PyYAML's pure loader would recurse
])
def test_deep_nesting_is_a_rule_error_not_a_recursion_error(tmp_path, depth, needle):
    path = tmp_path / "deep.yaml"
    path.write_text("when: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(RuleError, match=needle) as err:
        read_rule_file(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_nesting_up_to_the_limit_parses():
    levels = MAX_DEPTH - 1  # the top-level mapping is the first level
    doc = load_rule_yaml(("when: " + "[" * levels + "1" + "]" * levels + "\n").encode(), "ok.yaml")
    node, depth = doc["when"], 1
    while isinstance(node, list):
        node, depth = node[0], depth + 1
    assert node == 1 and depth == MAX_DEPTH


def test_rule_file_over_the_size_cap_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as fh:
        fh.write(b"id: huge\n")
        fh.truncate(200 * 1024 * 1024)  # sparse: 200 MB on paper
    started = time.perf_counter()
    with pytest.raises(RuleError, match=f"over the {MAX_RULE_FILE_BYTES:,} byte limit"):
        load_rules([tmp_path])
    assert time.perf_counter() - started < 2.0
    assert not (tmp_path / "cache" / "rules-validated.json").exists()


def test_a_fifo_as_rule_file_does_not_block(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with pytest.raises(RuleError, match="not a regular file"):
        read_rule_file(fifo)
    assert time.perf_counter() - started < 2.0


def test_tags_that_would_build_objects_are_refused(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("id: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(RuleError, match="invalid YAML") as err:
        read_rule_file(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_plan_rules_use_the_same_loader(tmp_path):
    """rules/gpus.yaml and rules/engines/*.yaml go through the one safe loader too."""
    from ckptinspect import rules
    from ckptinspect.plan import rules as plan_rules

    assert plan_rules.load_validated is rules.load_validated

    path = tmp_path / "gpus.yaml"
    path.write_text("gpus: &g [*g]\n")
    with pytest.raises(RuleError, match="aliases|anchors") as err:
        plan_rules.load_validated(path, "gpus.schema.json")
    assert str(err.value).startswith(str(path))


# -- the validation cache -------------------------------------------------------------------------------
def _doc(i: int, size: int) -> dict:
    return {"id": f"f{i}", "pad": "x" * size}


def test_cache_stays_under_its_cap_and_keeps_the_most_recently_used(tmp_path):
    path = tmp_path / "c.json"
    cache = ValidationCache(path)
    per_doc = 300 * 1024
    for i in range(30):  # 9 MB of documents offered
        cache.now = 1_000_000.0 + i
        cache.put(f"file {i}".encode(), _doc(i, per_doc))
    cache.save()
    assert path.stat().st_size <= ValidationCache.MAX_CACHE_BYTES
    again = ValidationCache(path)
    kept = {doc["id"] for doc in (again.get(f"file {i}".encode()) for i in range(30)) if doc is not None}
    assert kept and kept == {f"f{i}" for i in range(30 - len(kept), 30)}  # the newest ones survive


def test_cache_drops_large_documents_and_old_entries(tmp_path):
    path = tmp_path / "c.json"
    cache = ValidationCache(path)
    cache.put(b"big", _doc(0, ValidationCache.MAX_DOC_BYTES + 1))
    cache.now -= ValidationCache.MAX_AGE_S + 10
    cache.put(b"old", _doc(1, 10))
    cache.now += ValidationCache.MAX_AGE_S + 10
    cache.put(b"new", _doc(2, 10))
    cache.save()
    stored = json.loads(path.read_text())["docs"]
    assert [entry["doc"]["id"] for entry in stored.values()] == ["f2"]


def test_an_oversized_cache_file_is_not_loaded(tmp_path):
    path = tmp_path / "c.json"
    entry = {"doc": {"id": "x"}, "used": time.time(), "size": 10}
    docs = {f"{i:064x}": entry for i in range(80_000)}  # ~6.5 MB of valid cache
    path.write_text(json.dumps({"version": ValidationCache.VERSION, "docs": docs}))
    assert path.stat().st_size > ValidationCache.MAX_CACHE_BYTES
    assert ValidationCache(path).entries == {}
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"version": ValidationCache.VERSION, "docs": dict(list(docs.items())[:10])}))
    assert len(ValidationCache(small).entries) == 10  # the same entries under the cap are used


def test_only_validated_documents_are_cached(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    bad = dict(TOY, engines={"sglang": {"layer_use": "often"}})
    (user / "toy.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(RuleError):
        load_rules([user])
    cache = tmp_path / "cache" / "rules-validated.json"
    stored = json.loads(cache.read_text())["docs"] if cache.exists() else {}
    assert all(entry["doc"].get("id") != "toy" for entry in stored.values())
    (user / "toy.yaml").write_text(yaml.safe_dump(TOY))
    assert load_rules([user]).get("toy") is not None
    stored = json.loads(cache.read_text())["docs"]
    assert any(entry["doc"].get("id") == "toy" for entry in stored.values())
