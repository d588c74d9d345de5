"""`diff` with GGUF: two quants of one model, and a safetensors original against its GGUF (tensor names
mapped back through the converter's naming, checked against the gguf package's own TensorNameMap)."""

from __future__ import annotations

import pytest

from ckptinspect import api
from ckptinspect.inventory.gguf_names import BLOCK, GLOBAL
from fixtures.gguf_models import MODEL_DIRS, build, convert_safetensors

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def quants(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    names = ["GLM-4.5-Air-Q4_K_M", "GLM-4.5-Air-IQ3_S", "GLM-4.5-Air-noMTP-Q4_K_M"]
    build(root, names)
    return {n: root / MODEL_DIRS[n] for n in names}


@pytest.mark.parametrize("arch", ["glm4moe", "deepseek2", "qwen3moe", "llama"])
def test_every_mapped_module_round_trips_through_the_converter_map(arch):
    """HF module -> GGUF (the gguf package's TensorNameMap, as convert_hf_to_gguf.py uses it) -> our table -> HF."""
    arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, 8)
    checked = 0
    for base, hf in BLOCK.items():
        mapped = name_map.get_name(f"model.layers.3.{hf}")
        if mapped is None or not mapped.startswith("blk.3."):
            continue
        gguf_base = mapped[len("blk.3."):]
        assert gguf_base in BLOCK, (arch, hf, mapped)
        assert BLOCK[gguf_base] == hf, (arch, hf, mapped)
        checked += 1
    for base, hf in GLOBAL.items():
        assert name_map.get_name(hf) == base
    assert checked >= 10


def test_safetensors_original_against_its_gguf_matches_every_module(make_fixture, tmp_path):
    original = make_fixture("glm4_moe")
    converted = convert_safetensors(original, tmp_path / "gguf")
    d = api.diff(str(original), str(converted.parent))
    assert d.removed == () and d.added == () and d.findings == ()
    assert d.a.mtp_layers == d.b.mtp_layers == 1
    assert {(c.before, c.after) for c in d.scheme_changes} >= {("bf16", "Q8_0"), ("bf16", "F32")}
    mtp = [c for c in d.scheme_changes if c.mtp]
    assert {c.module for c in mtp} >= {"model.layers.{}.eh_proj", "model.layers.{}.shared_head.head",
                                       "model.layers.{}.mlp.experts"}
    # the other way round too
    back = api.diff(str(converted.parent), str(original))
    assert back.removed == () and back.added == ()


def test_two_quants_show_type_changes_and_a_dropped_head(quants):
    d = api.diff(str(quants["GLM-4.5-Air-Q4_K_M"]), str(quants["GLM-4.5-Air-IQ3_S"]))
    assert d.removed == () and d.added == ()
    assert {(c.before, c.after) for c in d.scheme_changes} == {("Q4_K", "IQ3_S"), ("Q8_0", "IQ3_S")}
    dropped = api.diff(str(quants["GLM-4.5-Air-Q4_K_M"]), str(quants["GLM-4.5-Air-noMTP-Q4_K_M"]))
    # the dropped head, and the llama.cpp verdict it costs (diff.py _readiness_findings)
    assert [f.code for f in dropped.findings] == ["mtp-dropped", "mtp-verdict-worse"]
    assert next(f for f in dropped.findings if f.code == "mtp-verdict-worse").engine == "llamacpp"
    assert all(c.mtp for c in dropped.removed)


def test_a_companion_mtp_head_counts_as_the_head(tmp_path):
    """Issue 34 §3: a head shipped as mtp-*.gguf next to the trunk is the same head as one inside the model
    (main: `mtp-modules-dropped`, exit 1, while `report` on that layout says READY); a trunk without its
    companion still trips the gate."""
    import shutil

    from conftest import run_cli

    names = ["GLM-4.5-Air-Q4_K_M", "GLM-4.5-Air-trunk-Q4_K_M"]
    build(tmp_path, names)
    inside, companion = (str(tmp_path / MODEL_DIRS[n]) for n in names)
    done = run_cli("diff", inside, companion, "--fail-on", "error", "--format", "json", "--quiet")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    codes = {f["code"] for f in __import__("json").loads(done.stdout)["findings"]}
    assert not codes & {"mtp-modules-dropped", "mtp-dropped", "mtp-layers-dropped"}, codes
    alone = tmp_path / "trunk-alone"
    alone.mkdir()
    shutil.copy(next(p for p in (tmp_path / MODEL_DIRS[names[1]]).iterdir() if not p.name.startswith("mtp-")), alone)
    dropped = run_cli("diff", inside, str(alone), "--fail-on", "error", "--quiet")
    assert dropped.returncode == 1 and "mtp-" in dropped.stderr
