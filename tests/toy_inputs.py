"""Small inputs several test modules build on: the smallest valid family rule, and a fixture copy
with an edited config.json (tests import this module by name; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

# The smallest family rule the schema accepts that still describes a NEXTN/MTP layer for both engines.
TOY_FAMILY_RULE = {
    "schema_version": 1, "id": "toy", "name": "Toy", "extends": "mtp_common",
    "match": {"architectures": ["ToyForCausalLM"], "model_types": ["toy"]},
    "mtp": {"depth": {"keys": ["num_nextn_predict_layers"]}, "prefixes": ["model.layers.{L+k}."],
            "base": "model.layers.{L+k}.", "required": ["enorm", "hnorm", "eh_proj"]},
    "engines": {"sglang": {"draft_architecture": "ToyNextN", "method": "NEXTN"},
                "vllm": {"draft_architecture": "ToyMTP", "method": "mtp"}},
}


def copy_with_config(src: Path, dst: Path, edit_config: Callable[[dict], None] | None = None) -> Path:
    """Copy checkpoint ``src`` to ``dst``, applying ``edit_config`` to the copy's config.json."""
    shutil.copytree(src, dst)
    if edit_config:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst
