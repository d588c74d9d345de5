"""The JSON mirror of the built-in rule files (ckptinspect/rules/mirror.py), a build output (hatch_build.py
writes it into the wheel, scripts/compile_rules.py into a checkout): exact, the same answers with and
without it, and never answering for a file whose bytes changed. The tests build their own mirror in a
copy of the rules folder, so they hold whether or not this checkout has one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptinspect.readiness.loader import load_rules
from ckptinspect.readiness.module_quant import module_quant_rules
from ckptinspect.rules import mirror
from ckptinspect.rules.documents import rules_root
from ckptinspect.safe_yaml import load_rule_yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _builtin_files() -> list[Path]:
    return sorted(p for p in rules_root().rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def _copy_rules(tmp_path: Path) -> Path:
    """A copy of the built-in rules folder with the mirror the build writes (and none of this checkout's)."""
    from scripts.compile_rules import expected

    root = tmp_path / "rules"
    shutil.copytree(rules_root(), root, ignore=shutil.ignore_patterns(mirror.MIRROR))
    (root / mirror.MIRROR).write_bytes(expected(root))
    return root


@pytest.fixture
def built_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The copy above as the built-in rules folder of this test."""
    from ckptinspect.readiness import loader
    from ckptinspect.rules import documents

    root = _copy_rules(tmp_path)
    monkeypatch.setattr(documents, "rules_root", lambda: root)
    monkeypatch.setattr(loader, "rules_root", lambda: root)
    import ckptinspect.readiness.module_quant as module_quant
    monkeypatch.setattr(module_quant, "rules_root", lambda: root)
    return root


def test_compile_rules_writes_what_the_build_writes(tmp_path):
    root = _copy_rules(tmp_path)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_rules.py"), "--check"],
                          capture_output=True, text=True)
    if (ROOT / "rules" / mirror.MIRROR).is_file():  # a checkout that has one: it must be current
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1 and "missing or stale" in done.stderr
    assert (root / mirror.MIRROR).read_bytes().count(b"\n") == len(_builtin_files())


def test_every_builtin_file_is_mirrored_with_the_yaml_answer_and_types(built_rules):
    entries = mirror._entries(built_rules)
    files = sorted(p for p in built_rules.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    assert len(files) > 50 and len(entries) == len(files) == len(_builtin_files())
    for path in files:
        via_mirror = mirror.builtin_rule_document(path, built_rules)
        via_yaml = load_rule_yaml(path.read_bytes(), path)
        assert mirror.same_values(via_mirror, via_yaml), path
        assert via_mirror is not mirror.builtin_rule_document(path, built_rules)  # a fresh copy per call


def test_load_rules_is_the_same_with_and_without_the_mirror(built_rules, monkeypatch):
    answered: list[str] = []
    real = mirror._entries

    def entries(root):
        out = real(root)
        answered.append(str(root))
        return out

    monkeypatch.setattr(mirror, "_entries", entries)
    with_mirror = load_rules()
    quant = {engine: module_quant_rules.__wrapped__(engine) for engine in ("sglang", "vllm")}
    assert str(built_rules) in answered and real(built_rules)  # the mirror was there to answer
    monkeypatch.setattr(mirror, "_entries", lambda root: {})
    assert load_rules() == with_mirror
    assert {engine: module_quant_rules.__wrapped__(engine) for engine in ("sglang", "vllm")} == quant

def test_an_edited_file_is_read_from_its_yaml_not_the_mirror(tmp_path):
    root = _copy_rules(tmp_path)
    path = root / "families" / "qwen3_5_moe.yaml"
    before = mirror.builtin_rule_document(path, root)
    path.write_text(path.read_text(encoding="utf-8").replace(f"name: {before['name']}", "name: Edited family", 1),
                    encoding="utf-8")
    after = mirror.builtin_rule_document(path, root)
    assert before["name"] != "Edited family" and after["name"] == "Edited family"
    assert mirror.same_values(after, load_rule_yaml(path.read_bytes(), path))


def test_a_damaged_mirror_leaves_every_file_to_its_yaml(tmp_path):
    root = _copy_rules(tmp_path)
    (root / mirror.MIRROR).write_bytes(b'{"path": "families/qwen3.yaml", "sha256": 1}\nnot json\n')
    assert mirror._entries(root) == {}
    path = root / "families" / "qwen3.yaml"
    assert mirror.same_values(mirror.builtin_rule_document(path, root), load_rule_yaml(path.read_bytes(), path))


def test_a_file_outside_the_rules_folder_is_never_answered_by_the_mirror(tmp_path):
    outside = tmp_path / "qwen3.yaml"
    outside.write_text("id: other\nname: Other\n", encoding="utf-8")
    assert mirror.builtin_rule_document(outside, rules_root()) == {"id": "other", "name": "Other"}


def test_documents_json_cannot_hold_are_left_out(tmp_path):
    root = tmp_path / "rules"
    root.mkdir()
    (root / "dated.yaml").write_text("id: x\nwhen: 2026-12-02\n", encoding="utf-8")
    (root / "int_key.yaml").write_text("id: y\nmap: {1: one}\n", encoding="utf-8")
    (root / "plain.yaml").write_text("id: z\nratio: 1.0\nflag: true\ncount: 1\n", encoding="utf-8")
    lines = mirror.mirror_lines(root, sorted(root.iterdir()))
    assert [line.split(b'"sha256"')[0] for line in lines] == [b'{"path":"plain.yaml",']


@pytest.mark.parametrize("a,b", [(1, 1.0), (1, True), (0, False), ({"a": 1}, {"a": 1.0}), ([1], [True])])
def test_same_values_tells_types_apart(a, b):
    assert a == b and not mirror.same_values(a, b)
