"""One member of an MTP weight group stored in another scheme than the others (issue 31: one routed MTP
expert's down_proj BF16 among block-FP8 experts).

Both engines build the routed experts as one fused parameter from the declared scheme (SGLang 0.5.23
layers/quantization/fp8.py Fp8MoEMethod.create_fp8_moe_weight_, vLLM 0.32.0 model_executor/layers/
quantization/fp8.py Fp8MoEMethod.create_weights: float8_e4m3fn) and copy each expert's tensor into its slot
(SGLang FusedMoE.weight_loader -> _load_w2, vLLM RoutedExperts._load_w2): the BF16 expert is cast, not
loaded as FP8 codes with their scales. The per-module table must say so member by member, the verdict must
rest on that row, and no finding may say otherwise.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptinspect.inventory.scan import GroupTally
from ckptinspect.pipeline import build_report
from fixtures.generate import FIXTURES, write_fixture
from tests.test_verdict_invariant import one_truth_violations, violations

CODE = "mtp-group-member-stored-unlike-built"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}


def _with_bf16_experts(tmp_path, experts: tuple[int, ...], name: str):
    """deepseek_v3_fp8 (MTP at model.layers.3) with the MTP experts ``experts``' down_proj stored BF16
    (their weight_scale_inv kept, as an exporter that skipped re-quantizing them leaves it)."""
    spec = FIXTURES["deepseek_v3_fp8"]
    odd = {f"model.layers.3.mlp.experts.{e}.down_proj.weight" for e in experts}
    tensors = tuple(replace(t, dtype="BF16") if t.name in odd else t for t in spec.tensors)
    assert sum(t.name in odd for t in tensors) == len(experts)
    return write_fixture(replace(spec, name=name, tensors=tensors), tmp_path)


def _row(report, module: str):
    return next(m for m in report.mtp.modules if m.module == module)


@pytest.mark.parametrize("experts", [(1,), (0,), (3,)])
def test_one_member_stored_bf16_among_fp8_experts_is_unusable(tmp_path, experts):
    path = _with_bf16_experts(tmp_path, experts, "ds_fp8_bf16_expert")
    report = build_report(str(path), progress=False, engine_versions=dict(VERSIONS))
    group = next(g for g in report.checkpoint.inventory.groups
                 if g.pattern == "model.layers.{}.mlp.experts.{}.down_proj.weight" and g.index == 3)
    # the group is the scheme of its most common dtype (whichever member comes first); the odd one by member
    assert group.scheme == "fp8_block"
    odd = {sub for sub, scheme in zip(group.subs, group.member_schemes) if scheme == "bf16"}
    assert odd == set(experts) and set(group.member_schemes) == {"fp8_block", "bf16"}
    row = _row(report, "model.layers.3.mlp.experts.{}.down_proj")
    assert row.stored.startswith("fp8_block (") and f"model.layers.3.mlp.experts.{experts[0]}.down_proj" in row.stored
    assert row.stored.count(" of ") == 1 and f"{len(experts)} of " in row.stored
    for engine in VERSIONS:
        assert row.built[engine] == "fp8" and row.matches[engine] is False
        verdict = report.mtp.verdicts[engine]
        assert verdict.verdict == "unusable" and CODE in verdict.reasons, verdict
        finding = next(f for f in report.mtp.findings if f.code == CODE and f.engine == engine)
        assert f"model.layers.3.mlp.experts.{experts[0]}.down_proj stored bf16" in finding.message
    # the sibling gate / up groups are stored alike and fit
    assert _row(report, "model.layers.3.mlp.experts.{}.up_proj").matches == {"sglang": True, "vllm": True}
    assert one_truth_violations(report) == [] and violations(report) == []


def test_a_member_in_another_fp8_dtype_is_unlike_the_parameter_built(tmp_path):
    """Same scheme, other codes: an F8_E5M2 expert among F8_E4M3 ones is copied into the group's
    float8_e4m3fn parameter (a conversion of the codes, which the dry-load reports as a mismatch)."""
    spec = FIXTURES["deepseek_v3_fp8"]
    odd = "model.layers.3.mlp.experts.2.down_proj.weight"
    tensors = tuple(replace(t, dtype="F8_E5M2") if t.name == odd else t for t in spec.tensors)
    path = write_fixture(replace(spec, name="ds_fp8_e5m2_expert", tensors=tensors), tmp_path)
    report = build_report(str(path), progress=False, engine_versions=dict(VERSIONS))
    row = _row(report, "model.layers.3.mlp.experts.{}.down_proj")
    assert row.stored == "fp8_block (1 of 4 members fp8_block/F8_E5M2: model.layers.3.mlp.experts.2.down_proj)"
    for engine in VERSIONS:
        assert row.matches[engine] is False and CODE in report.mtp.verdicts[engine].reasons
    assert one_truth_violations(report) == [] and violations(report) == []


def test_experts_stored_alike_do_not_fire(make_fixture):
    report = build_report(str(make_fixture("deepseek_v3_fp8")), progress=False, engine_versions=dict(VERSIONS))
    assert not any(g.member_schemes for g in report.checkpoint.inventory.groups)
    assert all(CODE not in v.reasons for v in report.mtp.verdicts.values())
    assert all(m.matches[e] for m in report.mtp.modules for e in VERSIONS)


def test_member_dtypes_follow_the_members_across_shards():
    """A group whose members sit in several shards: each shard's tally is merged, and the member dtypes
    stay aligned with the merged members (only once some member differs)."""
    a = GroupTally(2, 4, 4, "F8_E4M3", [2], [0, 1], None, False)
    b = GroupTally(2, 6, 4, "F8_E4M3", [2], [2, 3], {"F8_E4M3", "BF16"}, False, ["F8_E4M3", "BF16"])
    c = GroupTally(1, 2, 2, "F8_E4M3", [2], [4], None, False)
    merged = a.merged(b).merged(c)
    assert merged.subs == [0, 1, 2, 3, 4]
    assert merged.member_dtypes == ["F8_E4M3", "F8_E4M3", "F8_E4M3", "BF16", "F8_E4M3"]
    d = GroupTally(1, 2, 2, "BF16", [2], [5], None, False)  # a shard whose one member differs
    assert a.merged(d).member_dtypes == ["F8_E4M3", "F8_E4M3", "BF16"]
    assert a.merged(c).member_dtypes is None  # alike: nothing kept
