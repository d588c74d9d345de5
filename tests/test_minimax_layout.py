"""The full-scale MiniMax-M2.5 FP8 layout (fixtures/replica_minimax.py): 62 layers x 256 experts whose
Linears ``w1`` / ``w2`` / ``w3`` differ only in a digit inside a segment. Expectations are derived from
the config, not copied from a report."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ckptinspect.pipeline import build_report
from fixtures.replica_minimax import build_minimax_replica


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    root = build_minimax_replica(tmp_path_factory.mktemp("minimax"))
    config = json.loads((root / "config.json").read_text())
    return build_report(str(root), progress=False), config


def test_every_expert_and_attention_linear_is_fp8_block(minimax):
    report, config = minimax
    layers, experts = config["num_hidden_layers"], config["num_local_experts"]
    inv = report.checkpoint.inventory
    assert inv.totals.tensors == layers * (8 + 4 + 2 + experts * 3 * 2) + 3 == 96_103
    schemes = Counter()
    for g in inv.groups:
        schemes[g.scheme] += g.tensors
    # FP8 weight + weight_scale_inv for 4 attention and 3 x experts expert Linears per layer
    assert schemes["fp8_block"] == layers * (4 + 3 * experts) * 2
    assert schemes["fp8_tensor"] == 0 and schemes.get("other", 0) == 0
    assert schemes["fp32"] == layers * 2  # router gate + e_score_correction_bias
    fp32 = {g.pattern: g.component for g in inv.groups if g.scheme == "fp32"}
    assert set(fp32.values()) == {"router"}, fp32
    expert_weights = [g for g in inv.groups if g.component == "routed_expert" and g.role == "weight"]
    assert {g.pattern.rsplit(".", 2)[-2] for g in expert_weights} == {"w1", "w2", "w3"}
    assert all(g.scheme == "fp8_block" and g.dtypes == ("F8_E4M3",) for g in expert_weights)


def test_every_layer_holds_all_experts_and_no_false_companion_errors(minimax):
    report, config = minimax
    per_layer = report.checkpoint.inventory.experts_per_layer()
    assert per_layer == {layer: config["num_local_experts"] for layer in range(config["num_hidden_layers"])}
    codes = {f.code for f in report.checkpoint.findings}
    assert "quant-companion-count-mismatch" not in codes
    assert "missing-experts" not in codes
    assert "mixed-dtypes-in-group" not in codes
