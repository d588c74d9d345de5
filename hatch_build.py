"""Wheel build hook: the JSON mirror of the built-in rule files is generated here, at build time, into the
wheel's ``ckptinspect/_rules/mirror.jsonl`` (ckptinspect/rules/mirror.py reads it), never committed.

Declared in pyproject.toml as ``[tool.hatch.build.targets.wheel.hooks.custom]``. An editable install
and a plain source checkout have no mirror and read every rule file from its YAML (same answers, ~40 ms
more CPU per report: BENCHMARKS.md); ``python scripts/compile_rules.py`` writes one there too.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ROOT = Path(__file__).resolve().parent


class RulesMirrorHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        sys.path.insert(0, str(ROOT))
        try:
            from scripts.compile_rules import expected
        finally:
            sys.path.remove(str(ROOT))
        self._dir = tempfile.TemporaryDirectory()
        target = Path(self._dir.name) / "mirror.jsonl"
        target.write_bytes(expected(ROOT / "rules"))
        build_data["force_include"][str(target)] = "ckptinspect/_rules/mirror.jsonl"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if getattr(self, "_dir", None) is not None:
            self._dir.cleanup()
