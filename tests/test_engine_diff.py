"""scripts/engine_diff.py on two small engine trees: the cited function whose code changed, the cited file
that is gone and a new draft model file are listed with the rule files that cite them; formatting-only
edits are not changes (the comparison is over Python ASTs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOAD = '''
class DeepSeekMTP:
    def load_weights(self, weights):
        loaded = set()
        for name, tensor in weights:
            loaded.add(name)
        {tail}
        return loaded
'''


def _tree(base: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = base / "vllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return base


def _diff(old: Path, new: Path) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "engine_diff.py"), str(old), str(new), "--format",
                           "json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_changed_removed_and_new_are_listed_with_their_citing_rules(tmp_path):
    check = "if not loaded:\n            raise ValueError('MTP layer missing')"
    old = _tree(tmp_path / "old", {
        "model_executor/models/deepseek_mtp.py": LOAD.format(tail=check),
        "model_executor/model_loader/mtp_validation.py": "def is_mtp_completeness_check_enabled():\n    return True\n",
    })
    new = _tree(tmp_path / "new", {
        "model_executor/models/deepseek_mtp.py": LOAD.format(tail="pass"),
        "model_executor/models/brand_new_mtp.py": "class BrandNewMTP:\n    pass\n",
    })
    doc = _diff(old, new)
    changes = {(c["path"], c["status"], c["name"]): c["cited_by"] for c in doc["changes"]}
    removed = changes[("model_executor/model_loader/mtp_validation.py", "file removed", None)]
    assert "rules/families/deepseek_v3.yaml" in removed
    changed = [key for key in changes if key[0] == "model_executor/models/deepseek_mtp.py"]
    assert changed and all(status in ("changed", "name changed") for _, status, _ in changed)
    assert "vllm/model_executor/models/brand_new_mtp.py" in doc["new_draft_files"]


def test_formatting_only_is_no_change(tmp_path):
    text = LOAD.format(tail="pass")
    old = _tree(tmp_path / "old", {"model_executor/models/deepseek_mtp.py": text})
    new = _tree(tmp_path / "new", {"model_executor/models/deepseek_mtp.py": text.replace("loaded = set()",
                                                                                          "loaded = set()  # why")})
    assert _diff(old, new)["changes"] == []


def test_a_missing_wheel_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "engine_diff.py"), str(tmp_path / "nope.whl"),
                           str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no such wheel or directory" in done.stderr
