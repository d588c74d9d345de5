"""fixtures/corpus.py stores what each release stores: a block-FP8 config's exclusion lists
(``ignored_layers`` and ``modules_to_not_convert``, the two lists the engines' Fp8Config reads) name
modules the replica writes BF16, without a ``weight_scale_inv``."""

from __future__ import annotations

import pytest

from fixtures.corpus import corpus_tensors, entries, fp8_exclusions, reduced_config


def _entry(repo: str):
    return next(e for e in entries() if e.repo == repo)


def _dtypes(tensors) -> dict[str, str]:
    return {t.name: t.dtype for t in tensors}


def test_ignored_layers_are_stored_bf16():
    """MiMo-V2-Flash's release lists its backbone o_proj in ignored_layers (fixtures/families_misc.py
    mimo_v2_flash); the corpus copy lacks the list, so it is added here as the release carries it."""
    entry = _entry("XiaomiMiMo/MiMo-V2-Flash")
    config = reduced_config(entry)
    n = config["num_hidden_layers"]
    assert "ignored_layers" not in config["quantization_config"]  # the copy, as SOURCES.md says
    before = _dtypes(corpus_tensors(entry, config))
    config["quantization_config"]["ignored_layers"] = [f"model.layers.{i}.self_attn.o_proj" for i in range(n)]
    after = _dtypes(corpus_tensors(entry, config))
    for i in range(n):
        o = f"model.layers.{i}.self_attn.o_proj"
        assert before[f"{o}.weight"] == "F8_E4M3" and f"{o}.weight_scale_inv" in before
        assert after[f"{o}.weight"] == "BF16" and f"{o}.weight_scale_inv" not in after
        assert after[f"model.layers.{i}.self_attn.q_proj.weight"] == "F8_E4M3"
    # the MTP layers' o_proj are not listed by their checkpoint name: they stay as the config gives them
    assert after["model.mtp.layers.0.self_attn.o_proj.weight"] == "F8_E4M3"


def test_both_lists_are_read_together():
    """A config carrying both lists keeps every module either names BF16 (the engines pick one list:
    vLLM 0.32.0 fp8.py:162-168, SGLang 0.5.23 fp8.py:354-356; the release stores both unquantized)."""
    entry = _entry("Qwen/Qwen3-30B-A3B-FP8")
    config = reduced_config(entry)
    qc = config["quantization_config"]
    assert "model.layers.0.mlp.gate" in qc["modules_to_not_convert"]
    qc["ignored_layers"] = ["model.layers.1.self_attn.o_proj"]
    got = _dtypes(corpus_tensors(entry, config))
    assert got["model.layers.1.self_attn.o_proj.weight"] == "BF16"
    assert got["model.layers.0.mlp.gate.weight"] == "BF16"
    assert got["model.layers.0.self_attn.o_proj.weight"] == "F8_E4M3"


def test_minimax_reads_its_lists():
    """The MiniMax-M2 layout is written by fixtures/replica_minimax.py; an FP8 list entry still decides."""
    entry = _entry("MiniMaxAI/MiniMax-M2.5")
    config = reduced_config(entry)
    plain = _dtypes(corpus_tensors(entry, config))
    assert plain["model.layers.0.self_attn.o_proj.weight"] == "F8_E4M3"
    config["quantization_config"]["ignored_layers"] = ["model.layers.0.self_attn.o_proj"]
    got = _dtypes(corpus_tensors(entry, config))
    assert got["model.layers.0.self_attn.o_proj.weight"] == "BF16"
    assert "model.layers.0.self_attn.o_proj.weight_scale_inv" not in got
    assert got["model.layers.1.self_attn.o_proj.weight"] == "F8_E4M3"


@pytest.mark.parametrize("entry, name, named", [
    ("gate", "model.layers.3.block_sparse_moe.gate", True),        # a dotted tail (MiniMax-M2.x's list)
    ("gate", "model.layers.3.mlp.gate_proj", False),               # not inside a component
    ("model.layers.0.self_attn", "model.layers.0.self_attn.q_proj", True),  # a listed parent
    ("model.layers.0.self_attn", "model.layers.10.self_attn.q_proj", False),
    ("model.layers.*.self_attn", "model.layers.7.self_attn.o_proj", True),  # an fnmatch pattern
    ("model.layers.1.mlp.gate", "model.layers.1.mlp.gate", True),
])
def test_exclusion_names(entry, name, named):
    for key in ("ignored_layers", "modules_to_not_convert"):
        assert fp8_exclusions({key: [entry]})(name) is named


def test_every_real_list_entry_naming_a_stored_linear_is_bf16():
    """Over the real corpus: a list entry that is the full name of a stored weight never names an FP8 one."""
    checked = 0
    for entry in entries():
        config = reduced_config(entry)
        qc = config.get("quantization_config") or {}
        if qc.get("quant_method") != "fp8":
            continue
        listed = {e for key in ("ignored_layers", "modules_to_not_convert") for e in (qc.get(key) or ())}
        for t in corpus_tensors(entry, config):
            if t.name.endswith(".weight") and t.name[: -len(".weight")] in listed:
                checked += 1
                assert t.dtype != "F8_E4M3", (entry.repo, t.name)
    assert checked > 0
