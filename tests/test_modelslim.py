"""ModelSlim (Ascend) checkpoints: the per-tensor type map quant_model_description.json is read by every
source (local directory, Hub) the way SGLang reads it (SG:configs/model_config.py
_find_quant_modelslim_config: whenever the file is there, ahead of config.json), so `report` shows SGLang's
per-module answer. Fixtures: fixtures/modelslim.py (the sgl-project/sglang#37736 layout)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_repos import isolate_hf  # noqa: E402
from hub_server import HubServer  # noqa: E402

from ckptinspect.errors import ConfigError  # noqa: E402
from ckptinspect.pipeline import build_report  # noqa: E402
from ckptinspect.sources.hub import open_hub  # noqa: E402
from ckptinspect.sources.interface import MAX_INDEX_FILE_BYTES, QUANT_MODEL_DESCRIPTION  # noqa: E402
from toy_inputs import copy_with_config  # noqa: E402


def _reasons(mtp, engine):
    return set(mtp.verdicts[engine].reasons)


def _rows(report):
    return {row.module: row for row in report.mtp.modules}


def test_report_reads_the_type_map_and_shows_sglangs_answer(report):
    r = report("qwen3_5_dense_modelslim_w8a8")
    declared = r.checkpoint.declared
    assert (declared.method, declared.sources) == ("modelslim", (QUANT_MODEL_DESCRIPTION,))
    assert declared.raw["mtp.layers.0.self_attn.q_proj.weight"] == "W8A8_DYNAMIC"
    # weight_offset is ModelSlim's zero point: a companion, not a FLOAT tensor of its own
    assert set(r.mtp.schemes) == {"int8", "bf16"}
    sg = r.mtp.verdicts["sglang"]
    # SG:models/qwen3_5_mtp.py _mtp_quant_config: on an NPU the draft is built without a quant config unless
    # --speculative-draft-model-quantization is set; the int8 codes then load as BF16 numbers (#37736)
    assert sg.verdict == "unusable" and "mtp-modelslim-draft-unquantized" in _reasons(r.mtp, "sglang")
    finding = next(f for f in r.mtp.findings if f.code == "mtp-modelslim-draft-unquantized")
    assert "--speculative-draft-model-quantization modelslim" in finding.hint


def test_float_mtp_is_ready_in_sglang(report):
    """#34353's layout: every mtp.* FLOAT in the type map, the MTP stored BF16: SGLang builds it as stored."""
    r = report("qwen3_5_dense_modelslim_w8a8_mtp_float")
    assert r.checkpoint.declared.method == "modelslim"
    assert r.mtp.verdicts["sglang"].verdict == "ready"
    assert not [f for f in r.mtp.findings if f.engine == "sglang" and f.severity == "error"]


def test_type_map_wins_over_config_quantization(make_fixture, tmp_path):
    """SGLang takes ``modelslim_config or hf_config``: the file decides even when config.json declares too."""
    def declare_fp8(cfg):
        cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}

    d = copy_with_config(make_fixture("qwen3_5_dense_modelslim_w8a8"), tmp_path / "m", declare_fp8)
    assert build_report(str(d), progress=False).checkpoint.declared.method == "modelslim"
    (d / QUANT_MODEL_DESCRIPTION).unlink()
    assert build_report(str(d), progress=False).checkpoint.declared.method == "fp8"


def test_type_map_that_is_not_an_object_or_too_large_is_a_one_line_error(make_fixture, tmp_path):
    d = copy_with_config(make_fixture("qwen3_5_dense_modelslim_w8a8"), tmp_path / "m")
    (d / QUANT_MODEL_DESCRIPTION).write_text(json.dumps(["W8A8"]))
    with pytest.raises(ConfigError, match="quant_model_description.json"):
        build_report(str(d), progress=False)
    with open(d / QUANT_MODEL_DESCRIPTION, "wb") as fh:  # sparse: refused by size before any byte is read
        fh.truncate(MAX_INDEX_FILE_BYTES + 1)
    with pytest.raises(ConfigError, match="over the .* cap"):
        build_report(str(d), progress=False)


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    isolate_hf(monkeypatch, tmp_path / "hf_home")
    with HubServer() as srv:
        yield srv


def test_hub_reads_the_type_map_with_one_request_only_when_listed(hub, make_fixture):
    hub.add_repo("org/slim", make_fixture("qwen3_5_dense_modelslim_w8a8"))
    hub.add_repo("org/plain", make_fixture("qwen3_5_dense_bf16"))
    slim = open_hub("org/slim", endpoint=hub.url, progress=False)
    plain = open_hub("org/plain", endpoint=hub.url, progress=False)
    assert slim.json_files[QUANT_MODEL_DESCRIPTION]["mtp.fc.weight"] == "FLOAT"
    assert QUANT_MODEL_DESCRIPTION not in plain.json_files
    # the file costs exactly one request, and only on the repo that lists it
    assert slim.stats["requests"] - plain.stats["requests"] == 1
    log = hub.stats()["log"]
    assert sum(QUANT_MODEL_DESCRIPTION in e[1] for e in log) == 1
