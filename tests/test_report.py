"""`report` end to end on generated real-layout checkpoints: exact counts, schemes, components,
bad input handling, and the guarantees (no torch, no writes, no pickle)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import report_json, run_cli
from ckptinspect.pipeline import build_report
from ckptinspect.render.json_out import report_to_json, validate_report_json



def _good_names(specs) -> list[str]:
    return sorted(n for n in specs if not n.startswith("broken_"))


def test_every_good_fixture_counts_exactly(make_fixture, fixture_specs):
    """Tensors, bytes and logical params equal what the generator wrote; JSON follows the schema."""
    for name in _good_names(fixture_specs):
        spec = fixture_specs[name]
        doc = report_to_json(build_report(str(make_fixture(name))))
        validate_report_json(doc)
        assert doc["totals"] == {"tensors": spec.expected_tensors, "bytes": spec.expected_bytes,
                                 "params": spec.expected_params}, name
        assert doc["mtp"]["tensors"] == spec.mtp_tensors, name
        assert sum(b["tensors"] for b in doc["quantization"]["schemes"].values()) == spec.expected_tensors
        assert doc["model"]["family"] == spec.family, name


def test_qwen35_nvfp4_layout_via_cli(make_fixture):
    doc = report_json(make_fixture("qwen3_5_moe_nvfp4"))
    comps = doc["components"]
    assert comps["routed_expert"]["schemes"] == {"nvfp4": comps["routed_expert"]["tensors"]}
    assert set(comps["mtp"]["schemes"]) == {"bf16"}
    assert set(comps["router"]["schemes"]) == {"bf16"}
    assert "attention (linear)" in comps and "attention (gqa)" in comps
    assert doc["quantization"]["declared"] == "modelopt:NVFP4"
    assert doc["experts"]["routed"] == doc["experts"]["present_min"] == doc["experts"]["present_max"]
    assert doc["mtp"]["declared_key"] == "text_config.mtp_num_hidden_layers"
    codes = {(f["code"], f.get("subject")) for f in doc["findings"]}
    assert ("unquantized-not-excluded", "mtp.fc") in codes  # the real export's defect


def test_deepseek_fp8_mtp_layer_and_block_scheme(make_fixture):
    doc = report_json(make_fixture("deepseek_v3_fp8"))
    layers = doc["model"]["num_hidden_layers"]
    assert doc["mtp"]["present_layers"] == 1
    assert doc["mtp"]["layers"][0]["prefix"] == f"model.layers.{layers}."
    assert "fp8_block" in doc["quantization"]["schemes"] and doc["quantization"]["block_size"] == [128, 128]
    assert doc["components"]["attention (mla)"]["tensors"] > 0


def test_text_and_markdown_show_every_section(make_fixture):
    path = make_fixture("qwen3_5_moe_nvfp4")
    text = run_cli("report", str(path), "--quiet")
    assert text.returncode == 0, text.stderr
    for title in ("Summary", "Components", "Quantization schemes", "MTP summary", "MTP readiness", "Findings"):
        assert f"{title}" in text.stdout
    md = run_cli("report", str(path), "--format", "markdown")
    assert md.returncode == 0 and md.stdout.startswith("# ckptinspect report") and "| scheme" in md.stdout


def test_bundled_example_is_the_default(fixture_specs):
    result = run_cli("report", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    validate_report_json(doc)
    assert doc["totals"]["tensors"] == fixture_specs["qwen3_5_moe_nvfp4"].expected_tensors


def _tree_digest(root: Path) -> dict[str, tuple[int, str, float]]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest(),
                                               path.stat().st_mtime)
    return out


BROKEN = {
    "broken_truncated_header": "header",
    "broken_header_len_beyond_file": "runs past the end",
    "broken_overlapping_offsets": "overlaps the previous tensor",
    "broken_unknown_dtype": "unknown dtype",
    "broken_shape_bytes_mismatch": "bytes but data_offsets span",
    "broken_missing_shard": "missing",
    "broken_index_escape": "points outside the checkpoint directory",
    "broken_config_json": "config.json: is not valid JSON",
    "broken_config_types": "must be an integer",
    "broken_symlink_loop": "symlink loop",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_bad_input_is_one_line_exit_2_and_nothing_written(name, make_fixture):
    path = make_fixture(name)
    before = _tree_digest(path)
    result = run_cli("report", str(path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert BROKEN[name] in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert _tree_digest(path) == before
    debug = run_cli("--debug", "report", str(path))
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_bad_input_error_names_the_file(make_fixture):
    result = run_cli("report", str(make_fixture("broken_unknown_dtype")))
    assert ".safetensors" in result.stderr


def test_missing_directory_and_bad_repo_id():
    result = run_cli("report", "/nonexistent/dir/model")
    assert result.returncode == 2 and "error:" in result.stderr and "Traceback" not in result.stderr


def test_pickle_files_are_reported_never_opened(make_fixture):
    path = make_fixture("with_pickle")
    script = (
        "import sys, json\n"
        "opened = []\n"
        "sys.addaudithook(lambda ev, args: opened.append(str(args[0])) if ev == 'open' else None)\n"
        "from ckptinspect.pipeline import build_report\n"
        "from ckptinspect.render.json_out import report_to_json\n"
        f"doc = report_to_json(build_report({str(path)!r}))\n"
        "print(json.dumps({'codes': [f['code'] for f in doc['findings']], 'opened': opened}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert "pickle-files-present" in doc["codes"]
    pickles = [p for p in doc["opened"] if p.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    assert pickles == []
    assert any(p.endswith(".safetensors") for p in doc["opened"])


def test_report_never_imports_torch_or_transformers(make_fixture):
    path = make_fixture("deepseek_v3_fp8")
    script = (
        "import sys\n"
        "from ckptinspect.cli import main\n"
        f"try:\n    main(['report', {str(path)!r}, '--format', 'json', '--quiet'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def _rename_shards(src: Path, dst: Path) -> None:
    """Copy a checkpoint, giving every shard a zero-based name and reversing index order."""
    shutil.copytree(src, dst)
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = list(dict.fromkeys(index["weight_map"].values()))
    mapping = {s: f"model-{i:05d}-of-{len(shards) - 1:05d}.safetensors" for i, s in enumerate(reversed(shards))}
    for old, new in mapping.items():
        (dst / old).rename(dst / (new + ".tmp"))
    for new in mapping.values():
        (dst / (new + ".tmp")).rename(dst / new)
    index["weight_map"] = {k: mapping[v] for k, v in reversed(list(index["weight_map"].items()))}
    index_path.write_text(json.dumps(index))


def _stable(doc: dict) -> dict:
    doc = dict(doc)
    for key in ("source", "shards"):
        doc.pop(key)
    doc["mtp"] = {k: v for k, v in doc["mtp"].items() if k != "layers"}
    return doc


def test_shard_names_and_order_do_not_change_the_result(make_fixture, tmp_path):
    src = make_fixture("deepseek_v3_fp8")
    dst = tmp_path / "renamed"
    _rename_shards(src, dst)
    a, b = report_json(src), report_json(dst)
    assert _stable(a) == _stable(b)


def _drop_tensors(path: Path, shard: str, predicate) -> int:
    """Rewrite one shard without the tensors matching predicate (keeps the file valid)."""
    blob = (path / shard).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    kept, data, dropped = {}, bytearray(), 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = info["data_offsets"]
        if predicate(name):
            dropped += 1
            continue
        kept[name] = dict(info, data_offsets=[len(data), len(data) + e - b])
        data += blob[8 + n + b:8 + n + e]
    if meta is not None:
        kept["__metadata__"] = meta
    raw = json.dumps(kept).encode()
    raw += b" " * (-len(raw) % 8)
    (path / shard).write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not (v == shard and predicate(k))}
    index_path.write_text(json.dumps(index))
    return dropped


def test_missing_experts_are_counted_against_the_config(make_fixture, tmp_path):
    dst = tmp_path / "fewer-experts"
    shutil.copytree(make_fixture("qwen3_5_moe_nvfp4"), dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    victim = "model.language_model.layers.1.mlp.experts.3."
    shard = next(v for k, v in index["weight_map"].items() if k.startswith(victim))
    assert _drop_tensors(dst, shard, lambda n: n.startswith(victim)) > 0
    doc = report_json(dst)
    assert doc["experts"]["present_min"] == doc["experts"]["routed"] - 1
    assert "missing-experts" in {f["code"] for f in doc["findings"]}


def test_index_header_mismatch_is_an_error_finding(make_fixture, tmp_path):
    dst = tmp_path / "stale-index"
    shutil.copytree(make_fixture("deepseek_v3_fp8"), dst)
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = next(iter(index["weight_map"].values()))
    index["weight_map"]["model.layers.0.ghost.weight"] = first
    index_path.write_text(json.dumps(index))
    doc = report_json(dst)
    mismatch = [f for f in doc["findings"] if f["code"] == "index-header-mismatch"]
    assert mismatch and "model.layers.0.ghost.weight" in mismatch[0]["message"]


def test_help_lists_every_command():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("report", "diff", "rules", "plan", "snapshot", "probe"):
        assert command in result.stdout
    assert os.environ.get("CKPTINSPECT_DEBUG") is None


def test_mtp_cost_per_gpu_shrinks_with_tp(make_fixture):
    path = make_fixture("qwen3_5_moe_nvfp4")
    one = report_json(path, "--tp", "1")["mtp"]["cost"][0]
    four = report_json(path, "--tp", "4")["mtp"]["cost"][0]
    assert one["bytes_per_gpu"] == one["loaded_bytes"]  # TP1 holds the whole (loaded) MTP layer
    assert four["ep"] == 4 and four["bytes_per_gpu"] < one["bytes_per_gpu"]
    text = run_cli("report", str(path), "--tp", "4", "--quiet")
    assert "MTP cost at TP=4 EP=4" in text.stdout


@pytest.mark.parametrize("name", ["broken_missing_shard", "broken_index_escape", "broken_unknown_dtype",
                                  "broken_config_json", "broken_config_types"])
def test_bad_input_in_the_parallel_scan_path(name, make_fixture):
    """Errors raised inside worker processes (index summary, header scan), or in the parent while they
    scan (config), still become one line."""
    result = run_cli("report", str(make_fixture(name)))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and BROKEN[name] in result.stderr


@pytest.mark.parametrize("name,engine,gate,code", [
    ("deepseek_v3_nvfp4_nomtp", "vllm", "unusable", 1),     # declared but absent
    ("deepseek_v3_nvfp4_nomtp", "both", "degraded", 1),
    ("qwen3_5_moe_nvfp4", "both", "degraded", 0),           # complete BF16 MTP: ready on both
    ("llama_bf16", "both", "degraded", 0),                   # no MTP at all is not a failure
    ("mimo_v2_flash", "vllm", "degraded", 1),               # vLLM reuses layer 0 of 3
    ("mimo_v2_flash", "sglang", "degraded", 0),
])
def test_fail_on_gate(name, engine, gate, code, make_fixture):
    result = run_cli("report", str(make_fixture(name)), "--engine", engine, "--fail-on", gate, "--quiet")
    assert result.returncode == code, (result.stdout[-500:], result.stderr)
    if code:
        assert result.stderr.startswith(f"fail-on {gate}: MTP verdict")


def test_full_scale_qwen35_nvfp4_replica(qwen35_report):
    """The seed checkpoint's layout at full scale: 94 shards, ~371k tensors, BF16 MTP with all 512 experts."""
    from ckptinspect.render.json_out import report_to_json

    doc = report_to_json(qwen35_report)
    validate_report_json(doc)
    assert doc["shards"]["count"] == 94
    assert doc["experts"]["routed"] == doc["experts"]["present_min"] == doc["experts"]["present_max"] == 512
    assert doc["experts"]["moe_layers"] == doc["model"]["num_hidden_layers"] == 60
    assert doc["mtp"]["tensors"] == 1553 and doc["mtp"]["schemes"] == {"bf16": 1553}
    assert doc["mtp"]["layers"][0]["experts_present"] == 512 and doc["mtp"]["complete"]
    assert doc["mtp"]["verdict"] == {"sglang": "ready", "vllm": "ready"}
    nvfp4 = doc["quantization"]["schemes"]["nvfp4"]
    assert nvfp4["tensors"] == 60 * 512 * 3 * 4  # weight, weight_scale, weight_scale_2, input_scale
    assert doc["totals"]["tensors"] == sum(b["tensors"] for b in doc["quantization"]["schemes"].values())
    assert 390e9 < doc["totals"]["params"] < 410e9  # "397B": packed NVFP4 counted as logical values
