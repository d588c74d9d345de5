"""`ckptinspect diff`: scheme changes per module pattern, disappeared MTP, exclude lists, size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ckptinspect.api import diff as load_and_diff
from ckptinspect.render.diff_out import compact_ranges


def header_bytes_total(d: Path) -> int:
    total = 0
    for shard in d.glob("*.safetensors"):
        with open(shard, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def test_bf16_original_vs_nvfp4_quant(make_fixture):
    a, b = make_fixture("qwen3_5_moe_nvfp4_fused"), make_fixture("qwen3_5_moe_nvfp4")
    d = load_and_diff(str(a), str(b))
    assert d.a.label is None and d.b.label == "modelopt:NVFP4"
    assert d.a.bytes == header_bytes_total(a) and d.b.bytes == header_bytes_total(b)
    assert d.bytes_delta == header_bytes_total(b) - header_bytes_total(a) < 0
    experts = [c for c in d.scheme_changes if c.module == "model.language_model.layers.{}.mlp.experts"]
    assert len(experts) == 1
    change = experts[0]
    assert (change.before, change.after, change.component) == ("bf16", "nvfp4", "routed_expert")
    assert change.layers == (0, 1, 2, 3) and change.bytes_b < change.bytes_a and not change.mtp
    # grouped (A) vs per-expert (B) storage is not reported as removed / added modules
    assert d.removed == () and d.added == ()
    assert "mtp.layers.0*" in d.excludes_only_b and d.excludes_only_a == ()
    assert not any(f.code.startswith("mtp-") for f in d.findings)


def test_quant_that_dropped_the_mtp_layer(make_fixture):
    d = load_and_diff(str(make_fixture("qwen3_5_moe_nvfp4")), str(make_fixture("qwen3_5_moe_nvfp4_nomtp")))
    assert d.a.mtp_layers == 1 and d.b.mtp_layers == 0
    removed = {c.module for c in d.removed}
    assert {"mtp.fc", "mtp.layers.{}.mlp.experts", "mtp.layers.{}.self_attn.q_proj"} <= removed
    assert all(c.mtp for c in d.removed)
    assert d.removed[0].mtp  # MTP first
    dropped = [f for f in d.findings if f.code == "mtp-dropped"]
    assert len(dropped) == 1 and dropped[0].severity == "error" and "graft" in dropped[0].hint
    assert d.bytes_delta == -d.a.mtp_bytes


def test_mtp_requantized(make_fixture):
    d = load_and_diff(str(make_fixture("deepseek_v3_nvfp4")), str(make_fixture("deepseek_v3_nvfp4_mtp_fp4")))
    mtp_changes = [c for c in d.scheme_changes if c.mtp]
    assert mtp_changes, "MTP scheme changes must be reported"
    assert all(c.before == "bf16" and c.after == "nvfp4" for c in mtp_changes)
    assert {c.component for c in mtp_changes} >= {"routed_expert"}
    assert not [c for c in d.scheme_changes if not c.mtp]


def test_identical_checkpoints(make_fixture):
    p = str(make_fixture("deepseek_v3_fp8"))
    d = load_and_diff(p, p)
    assert d.scheme_changes == d.removed == d.added == () and d.findings == () and d.bytes_delta == 0


def test_cli_text_and_json(make_fixture, cli):
    a, b = str(make_fixture("qwen3_5_moe_nvfp4")), str(make_fixture("qwen3_5_moe_nvfp4_nomtp"))
    res = cli("diff", a, b, "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc) == {"schema_version", "a", "b", "size", "scheme_changes", "removed", "added", "excludes",
                        "findings"}
    assert doc["schema_version"] == 1
    assert doc["size"]["bytes_delta"] == doc["b"]["bytes"] - doc["a"]["bytes"]
    assert doc["a"]["mtp"]["layers"] == 1 and doc["b"]["mtp"]["layers"] == 0
    assert {"component", "module", "layers", "before", "after", "bytes_a", "bytes_b", "mtp"} == set(doc["removed"][0])
    assert doc["findings"][0]["code"] == "mtp-dropped"
    text = cli("diff", a, b)
    assert text.returncode == 0
    assert "only in A (disappeared)" in text.stdout and "[MTP]" in text.stdout and "mtp-dropped" in text.stdout
    missing = cli("diff", a, str(Path(a).parent / "does-not-exist"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_compact_ranges():
    assert compact_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert compact_ranges([]) == ""


def test_diff_output_does_not_depend_on_the_hash_seed(make_fixture):
    """The first dropped MTP module quoted in mtp-modules-dropped is the first in sorted order, not in set
    order (string hashing changes with PYTHONHASHSEED, and so did the message)."""
    import os
    import subprocess
    import sys

    a, b = make_fixture("deepseek_v4_flash"), make_fixture("qwen3_5_moe_nvfp4")
    outs = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run([sys.executable, "-m", "ckptinspect", "diff", str(a), str(b), "--format", "json"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        outs.add(done.stdout)
    assert len(outs) == 1
    doc = json.loads(outs.pop())
    dropped = [f for f in doc["findings"] if f["code"] == "mtp-modules-dropped"]
    assert dropped, doc["findings"]
    mtp_removed = sorted(c["module"] for c in doc["removed"] if c["mtp"])
    assert f"(e.g. {mtp_removed[0]})" in dropped[0]["message"]


def test_diff_gate_trips_on_a_requantized_mtp_layer(make_fixture, tmp_path):
    """README quickstart 4: `diff BF16 QUANT --fail-on error` must trip when QUANT's MTP layer cannot be
    used, although no module disappeared (issue 26 item 1). The diff carries B's readiness errors and
    each verdict that got worse, with its engine."""
    from ckptinspect.api import diff_gate, inspect

    a, b = make_fixture("deepseek_v3_nvfp4"), make_fixture("deepseek_v3_nvfp4_mtp_fp4")
    d = load_and_diff(str(a), str(b))
    assert d.removed == ()
    report_b = inspect(str(b))
    b_errors = {(f.code, f.engine) for f in report_b.mtp.findings if f.severity == "error"}
    assert b_errors and b_errors <= {(f.code, f.engine) for f in d.findings if f.severity == "error"}
    worse = {f.engine: f.severity for f in d.findings if f.code == "mtp-verdict-worse"}
    expected = {e: {"unusable": "error", "degraded": "warning"}[v.verdict]
                for e, v in report_b.mtp.verdicts.items() if v.verdict != "ready"}
    assert worse == expected and "error" in worse.values()
    assert diff_gate(d, "error")
    # the reverse direction (B is the good one) is no regression
    assert not [f for f in load_and_diff(str(b), str(a)).findings if f.code == "mtp-verdict-worse"]


def test_diff_cli_gate_exit_code_on_requantized_mtp(make_fixture):
    import subprocess
    import sys

    a, b = make_fixture("deepseek_v3_nvfp4"), make_fixture("deepseek_v3_nvfp4_mtp_fp4")
    r = subprocess.run([sys.executable, "-m", "ckptinspect", "diff", str(a), str(b), "--fail-on", "error"],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "mtp-verdict-worse [sglang]" in r.stdout and "fail-on error" in r.stderr
