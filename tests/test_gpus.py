"""GPU catalog: schema, required entries, lookup by alias, unknown names listing the catalog."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from ckptinspect.errors import PlanError
from ckptinspect.plan import find_gpu, load_gpus
from ckptinspect.plan.rules import engine_rules, rules_root

REQUIRED = ["h100", "h100-pcie", "h200", "h20", "b200", "b300", "gb200", "rtx-pro-6000", "rtx-5090", "l40s",
            "a100", "dgx-spark", "mi300x", "mi355x"]


def test_catalog_validates_against_schema() -> None:
    data = yaml.safe_load((rules_root() / "gpus.yaml").read_text())
    jsonschema.validate(data, json.loads((rules_root() / "schema" / "gpus.schema.json").read_text()))


def test_schema_rejects_entry_without_source() -> None:
    data = yaml.safe_load((rules_root() / "gpus.yaml").read_text())
    del data["gpus"][0]["source"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json.loads((rules_root() / "schema" / "gpus.schema.json").read_text()))


@pytest.mark.parametrize("alias", REQUIRED)
def test_required_gpus_resolve(alias: str) -> None:
    gpu = find_gpu(alias)
    assert gpu.memory_gib > 0 and gpu.source


@pytest.mark.parametrize("alias,arch,interconnect", [
    ("RTX PRO 6000", "sm120", "pcie"), ("b200", "sm100", "nvlink"), ("H200", "sm90", "nvlink"),
    ("b300", "sm103", "nvlink"), ("dgx_spark", "sm121", "other"), ("mi300x", "gfx942", "infinity_fabric"),
])
def test_lookup_is_case_space_and_underscore_insensitive(alias: str, arch: str, interconnect: str) -> None:
    gpu = find_gpu(alias)
    assert (gpu.arch, gpu.interconnect) == (arch, interconnect)


def test_unknown_gpu_lists_known_names() -> None:
    with pytest.raises(PlanError) as err:
        find_gpu("tpu-v5")
    text = str(err.value)
    assert "tpu-v5" in text
    for gpu in load_gpus():
        assert gpu.name in text


def test_aliases_are_unique() -> None:
    seen: dict[str, str] = {}
    for gpu in load_gpus():
        for key in {gpu.name.lower(), *gpu.aliases}:
            assert key not in seen, f"{key} names both {seen[key]} and {gpu.name}"
            seen[key] = gpu.name


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_catalog_arch_has_engine_rules(engine: str) -> None:
    classes = engine_rules(engine)["arch_classes"]
    for gpu in load_gpus():
        assert gpu.arch in classes, f"{gpu.name} ({gpu.arch}) has no {engine} arch class"
