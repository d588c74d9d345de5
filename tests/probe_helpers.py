"""Shared helpers of the probe tests (fixture paths, model loading)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "fixtures", "probe"))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import build_fixtures  # noqa: E402


def fixture(kind: str) -> str:
    return build_fixtures.fixture_dir(kind)


def load_main(path: str):
    from ckptinspect.probe import loader
    from ckptinspect.probe.heads import find_spec

    config = loader.read_config(path)
    spec = find_spec(config)
    main = loader.load_main_model(path, config, main_model_type=spec.main_model_type, device_map={"": "cpu"},
                                  dtype=torch.float32, trust_remote_code=False)
    return main, spec


def write_prompts(tmp_path, texts):
    import json

    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"category": "t", "prompt": t}) for t in texts) + "\n", encoding="utf-8")
    return str(p)
