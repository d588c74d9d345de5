"""Hostile rule files: alias bombs, recursive aliases, deep nesting, huge files, FIFOs. Each fails fast with
a one-line RuleError naming the file; no validation result is kept between runs (a poisoned cache directory
changes nothing)."""

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
from ckptinspect.readiness.loader import load_rules, read_rule_file
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
    with pytest.raises(RuleError) as err:
        load_rules([path.parent])
    message = str(err.value)
    assert message.startswith(str(path)) and ("anchors" in message or "aliases" in message)
    assert "\n" not in message
    assert not (tmp_path / "cache").exists()  # no run writes a validation cache


def test_rules_validate_cli_on_a_bomb_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMBS["exponential"])
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "rules", "validate", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "CKPTINSPECT_CACHE_DIR": str(tmp_path / "c")})
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
    with pytest.raises(RuleError, match=f"over the {MAX_RULE_FILE_BYTES:,} byte limit"):
        load_rules([tmp_path])
    assert not (tmp_path / "cache" / "rules-validated.json").exists()


def test_a_fifo_as_rule_file_does_not_block(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(RuleError, match="not a regular file"):
        read_rule_file(fifo)


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

    assert plan_rules.load_rule_document is rules.load_rule_document

    path = tmp_path / "gpus.yaml"
    path.write_text("gpus: &g [*g]\n")
    with pytest.raises(RuleError, match="aliases|anchors") as err:
        plan_rules.load_rule_document(path, "gpus.schema.json")
    assert str(err.value).startswith(str(path))


# -- no validation cache: nothing read back from a previous run decides an answer ----------------------
def _poisoned_cache(directory: Path) -> None:
    """What main's run-time validation cache read back (version 2, keyed by sha256(schema digest + file
    bytes)): every built-in family file mapped to a document that is not what the file says."""
    import hashlib

    from ckptinspect.readiness.loader import builtin_dir
    from ckptinspect.rules.documents import schema_path

    digest = hashlib.sha256(schema_path().read_bytes()).hexdigest()
    docs = {}
    for path in sorted(builtin_dir().glob("*.yaml")):
        key = hashlib.sha256(digest.encode() + b"\0" + path.read_bytes()).hexdigest()
        docs[key] = {"doc": {"id": path.stem.lstrip("_"), "schema_version": 1}, "used": time.time(), "size": 10}
    directory.mkdir(parents=True)
    (directory / "rules-validated.json").write_text(json.dumps({"version": 2, "docs": docs}))


def test_a_poisoned_rule_cache_changes_no_answer(tmp_path, make_fixture):
    """Issue 26: a cache file in CKPTINSPECT_CACHE_DIR made `--fail-on` gates pass or crash. No rule
    validation result is kept between runs any more: the same report with a poisoned cache directory as
    with an empty one, and nothing is written there."""
    fixture = make_fixture("deepseek_v3_nvfp4_mtp_fp4")
    clean, poisoned = tmp_path / "clean", tmp_path / "poisoned"
    clean.mkdir()
    _poisoned_cache(poisoned)
    before = (poisoned / "rules-validated.json").read_bytes()

    def run(cache: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ckptinspect", "report", str(fixture), "--format", "json",
                               "--fail-on", "degraded", "-q"], capture_output=True, text=True, cwd=REPO,
                              timeout=120, env={**os.environ, "CKPTINSPECT_CACHE_DIR": str(cache)})

    good, bad = run(clean), run(poisoned)
    assert good.returncode == 1 and "fail-on degraded" in good.stderr
    assert (bad.returncode, bad.stdout) == (good.returncode, good.stdout), bad.stderr[-500:]
    assert list(clean.iterdir()) == [] and (poisoned / "rules-validated.json").read_bytes() == before


def test_user_rule_files_are_validated_on_every_load(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "toy.yaml").write_text(yaml.safe_dump(TOY))
    assert load_rules([user]).get("toy") is not None
    (user / "toy.yaml").write_text(yaml.safe_dump(dict(TOY, engines={"sglang": {"layer_use": "often"}})))
    with pytest.raises(RuleError, match=r"layer_use"):
        load_rules([user])