"""Hostile local input (issue 11): one error line and exit 2, never a traceback, a hang or a write.

Each class of the issue is built on a copy of the bundled real-layout example (Qwen3.5 NVFP4 tiny) and
run through the real CLI; the model directory is compared byte for byte before and after every command.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from conftest import run_cli  # noqa: E402

from ckptinspect.json_text import MAX_JSON_DEPTH, decode_json  # noqa: E402
from ckptinspect.errors import ConfigError, HeaderError, SourceError  # noqa: E402
from ckptinspect.examples import EXAMPLE_DIR  # noqa: E402
from ckptinspect.header.parser import parse_header  # noqa: E402
from ckptinspect.sources.interface import MAX_JSON_FILE_BYTES, read_file_bytes  # noqa: E402

INDEX = "model.safetensors.index.json"
SHARD = "model-00002-of-00003.safetensors"


def _digest(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir" if path.is_dir() else f"mode:{path.lstat().st_mode:o}"
    return out


@pytest.fixture()
def model(tmp_path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(EXAMPLE_DIR, target)
    return target


def _run(model: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    before = _digest(model)
    result = run_cli(*(args or ("report", str(model), "--quiet", "--format", "json")), timeout=timeout)
    assert _digest(model) == before, "the model directory changed"
    return result


def _assert_one_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _prepend_key(path: Path, fragment: str) -> None:
    """Insert ``fragment`` ("key": value) as the first member of the JSON object in ``path``."""
    text = path.read_text(encoding="utf-8").lstrip()
    assert text.startswith("{")
    path.write_text("{" + fragment + "," + text[1:], encoding="utf-8")


HOSTILE_MEMBERS = {
    "int-5000-digits": '"zz_big": ' + "9" * 5000,
    "int-5000-digits-negative": '"zz_big": -' + "9" * 5000,
    "nesting-200": '"zz_deep": ' + "[" * 200 + "]" * 200,
    "nesting-5000": '"zz_deep": ' + "[" * 5000 + "]" * 5000,
    "objects-5000": '"zz_deep": ' + '{"a":' * 5000 + "1" + "}" * 5000,
    "lone-surrogate-key": '"zz\\ud800": 1',
    "lone-surrogate-value": '"zz": ["\\udc00"]',
}


@pytest.mark.parametrize("member", HOSTILE_MEMBERS, ids=list(HOSTILE_MEMBERS))
@pytest.mark.parametrize("file", ["config.json", "hf_quant_config.json", INDEX])
def test_hostile_json_in_every_metadata_file_is_one_line(model, file, member):
    _prepend_key(model / file, HOSTILE_MEMBERS[member])
    _assert_one_line(_run(model), file)


@pytest.mark.parametrize("member", HOSTILE_MEMBERS, ids=list(HOSTILE_MEMBERS))
def test_hostile_json_in_a_snapshot_is_one_line(model, tmp_path, member):
    snap = tmp_path / "m.json.gz"
    assert run_cli("snapshot", str(model), "-o", str(snap), "--quiet").returncode == 0
    text = gzip.decompress(snap.read_bytes()).decode("utf-8")
    snap.write_bytes(gzip.compress(("{" + HOSTILE_MEMBERS[member] + "," + text[1:]).encode("utf-8")))
    _assert_one_line(run_cli("report", str(snap), "--quiet"), str(snap))


def _rewrite_header(path: Path, edit) -> None:
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = edit(blob[8:8 + n].decode("utf-8").rstrip())
    raw = header.encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n:])


def test_lone_surrogate_in_a_tensor_name_is_one_line(model):
    _rewrite_header(model / SHARD, lambda h: h.replace('"model.', '"model\\ud800.', 1))
    _assert_one_line(_run(model), SHARD, "surrogate")


def test_lone_surrogate_in_a_tensor_name_via_a_snapshot(model, tmp_path):
    snap = tmp_path / "m.json.gz"
    assert run_cli("snapshot", str(model), "-o", str(snap), "--quiet").returncode == 0
    doc = json.loads(gzip.decompress(snap.read_bytes()))
    # The header text inside the snapshot holds the escape (the header parser must refuse it) ...
    doc["headers"][SHARD] = doc["headers"][SHARD].replace('"model.', '"model\\ud800.', 1)
    snap.write_bytes(gzip.compress(json.dumps(doc).encode()))
    _assert_one_line(run_cli("report", str(snap), "--quiet"), SHARD, "surrogate")
    # ... and a lone surrogate in the snapshot's own JSON strings is refused when the snapshot is read.
    text = json.dumps(doc).replace('"model\\\\ud800.', '"model\\ud800.', 1)
    snap.write_bytes(gzip.compress(text.encode()))
    _assert_one_line(run_cli("report", str(snap), "--quiet"), str(snap), "surrogate")


def test_nul_byte_in_a_weight_map_value_is_one_line(model):
    index = json.loads((model / INDEX).read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "model-00001\u0000-of-00003.safetensors"
    (model / INDEX).write_text(json.dumps(index))
    _assert_one_line(_run(model), INDEX, "not a file name")


@pytest.mark.parametrize("value,needle", [
    ('["a", 128]', "weight_block_size"), ("[null]", "weight_block_size"), ("[1e400]", "weight_block_size"),
    ("[128, true]", "weight_block_size"), ('"128"', "weight_block_size"), ("[]", "weight_block_size"),
])
def test_wrong_types_in_weight_block_size_are_one_line(model, value, needle):
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = "@@"
    (model / "config.json").write_text(json.dumps(config).replace('"@@"', value))
    _assert_one_line(_run(model), "config.json", needle)


@pytest.mark.parametrize("groups", ['[{"weights": {"num_bits": 4}}]', '"x"', '{"group_0": [1]}'])
def test_config_groups_of_the_wrong_type_are_one_line(model, groups):
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"]["config_groups"] = "@@"
    (model / "config.json").write_text(json.dumps(config).replace('"@@"', groups))
    _assert_one_line(_run(model), "config.json", "config_groups")


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_non_regular_indexed_shard_is_refused_without_blocking(model, kind):
    path = model / SHARD
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    result = _run(model, timeout=30)  # a blocking open would hit the timeout (TimeoutExpired)
    _assert_one_line(result, SHARD, "not a regular file")


def test_fifo_as_json_file_never_blocks(model):
    (model / "hf_quant_config.json").unlink()
    os.mkfifo(model / "hf_quant_config.json")
    with pytest.raises(SourceError, match="not a regular file"):
        read_file_bytes(model / "hf_quant_config.json")
    result = _run(model, timeout=30)
    assert result.returncode in (0, 2)  # not listed as a metadata file: the report runs without it


def test_sparse_2gib_config_is_refused_fast_in_bounded_memory(model):
    config = model / "config.json"
    with open(config, "r+b") as fh:
        fh.truncate(2 * 1024 ** 3)  # a sparse hole: 2 GiB apparent, nothing on disk
    # The child's own peak (VmHWM resets at exec; getrusage's ru_maxrss is inherited across execve, so a
    # child forked from a large pytest worker would report the worker's peak).
    script = ("import re, sys; from ckptinspect.cli import main\n"
              "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
              "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
              "print(code, hwm)")
    out = subprocess.run([sys.executable, "-c", script, "report", str(model), "--quiet"], capture_output=True,
                         text=True, timeout=60, cwd=str(ROOT))
    code, rss_kb = out.stdout.split()
    assert code == "2" and "config.json" in out.stderr and "cap" in out.stderr, out.stderr
    assert int(rss_kb) < 300 * 1024, rss_kb  # never read: ~60 MB interpreter


def test_json_size_cap_is_checked_before_reading(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_JSON_FILE_BYTES + 1)
    with pytest.raises(ConfigError, match="cap"):
        read_file_bytes(path)
    path.write_bytes(b"{}")
    assert read_file_bytes(path) == b"{}"


def test_depth_cap_is_the_reference_limit():
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert decode_json(ok.encode(), source="x") is not None
    with pytest.raises(ConfigError, match="deeper than 127"):
        decode_json(("[" + ok + "]").encode(), source="x")


@pytest.mark.parametrize("header", [
    # prod() of a string times a huge int would allocate gigabytes; of 25,000 4,000-digit dims, run for minutes.
    '{"t":{"dtype":"U8","shape":["%s",1000000000],"data_offsets":[0,1]}}' % ("x" * 5000),
    '{"t":{"dtype":"U8","shape":[[1,2,3],1000000000],"data_offsets":[0,1]}}',
    '{"t":{"dtype":"U8","shape":[%s],"data_offsets":[0,1]}}' % ",".join(["9" * 4000] * 2000),
    # A float meeting a 400-digit integer raises OverflowError (found by benchmarks/fuzz.py).
    '{"t":{"dtype":"U8","shape":[1e300,%s],"data_offsets":[0,1]}}' % ("9" * 400),
    '{"t":{"dtype":"U8","shape":[1],"data_offsets":[1e300,%s]}}' % ("9" * 400),
])
def test_header_shapes_never_cost_unbounded_time_or_memory(header):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(HeaderError):
        parse_header(header.encode(), source="x.safetensors", file_size=None)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_experts"])
def test_huge_counts_in_config_are_refused_not_enumerated(model, key):
    config = json.loads((model / "config.json").read_text())
    config["text_config"][key] = 10 ** 12  # one entry per layer / expert id would never finish
    config["text_config"].pop("layer_types", None)
    (model / "config.json").write_text(json.dumps(config))
    _assert_one_line(_run(model, timeout=60), "config.json", "10,000" if key == "num_hidden_layers" else "65,536")


def test_config_integers_over_64_bits_are_one_line(model):
    config = json.loads((model / "config.json").read_text())
    config["text_config"]["moe_intermediate_size"] = "@@"  # overflowed the plan's float arithmetic
    (model / "config.json").write_text(json.dumps(config).replace('"@@"', "9" * 400))
    _assert_one_line(_run(model, "report", str(model), "--quiet", "--gpu", "H200", "--gpus", "8"),
                     "config.json", "moe_intermediate_size")


def test_no_weights_is_an_error_finding_and_fails_the_gate(model):
    for shard in model.glob("*.safetensors"):
        shard.unlink()
    (model / INDEX).unlink()
    result = _run(model)
    assert result.returncode == 0
    findings = {f["code"]: f for f in json.loads(result.stdout)["findings"]}
    assert findings["no-weights"]["severity"] == "error"
    gated = _run(model, "report", str(model), "--quiet", "--fail-on", "error")
    assert gated.returncode == 1 and "no-weights" in gated.stderr


def test_only_pickle_weights_is_no_weights(model):
    for shard in model.glob("*.safetensors"):
        shard.unlink()
    (model / INDEX).unlink()
    (model / "pytorch_model.bin").write_bytes(b"not opened")
    findings = {f["code"]: f for f in json.loads(_run(model).stdout)["findings"]}
    assert findings["no-weights"]["severity"] == "error" and "pytorch_model.bin" in findings["no-weights"]["message"]


def test_fail_on_error_passes_a_clean_checkpoint_and_trips_on_any_error(model, tmp_path):
    clean = _run(model, "report", str(model), "--quiet", "--format", "json")
    errors = [f for f in json.loads(clean.stdout)["findings"] if f["severity"] == "error"]
    gated = _run(model, "report", str(model), "--quiet", "--fail-on", "error")
    assert gated.returncode == (1 if errors else 0)
    index = json.loads((model / INDEX).read_text())
    index["weight_map"].pop(next(iter(index["weight_map"])))  # index-header-mismatch: an error finding
    (model / INDEX).write_text(json.dumps(index))
    gated = _run(model, "report", str(model), "--quiet", "--fail-on", "error")
    assert gated.returncode == 1 and "fail-on error" in gated.stderr


def _hf_cache(tmp_path: Path, model: Path) -> tuple[Path, Path]:
    """A Hugging Face cache repo folder (blobs/, refs/, snapshots/<rev>/ links) holding ``model``."""
    repo = tmp_path / "hub" / "models--org--tiny"
    rev = "a" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    for path in model.iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob.name)
    return repo, snapshot


@pytest.mark.parametrize("where", ["blobs/x.json.gz", "refs/x.json.gz", "snapshots/other/x.json.gz", "x.json.gz",
                                   "snapshots/REV/x.json.gz", "snapshots/REV/sub/x.json.gz"])
def test_snapshot_refuses_every_folder_of_an_hf_cache_repo(model, tmp_path, where):
    repo, snapshot = _hf_cache(tmp_path, model)
    target = repo / where.replace("REV", snapshot.name)
    before = _digest(repo)
    result = run_cli("snapshot", str(snapshot), "-o", str(target), "--quiet")
    _assert_one_line(result, "refusing")
    assert _digest(repo) == before and not target.exists()


def test_snapshot_refuses_a_target_linked_into_the_model_dir(model, tmp_path):
    link = tmp_path / "out"
    link.symlink_to(model)
    result = _run(model, "snapshot", str(model), "-o", str(link / "x.json.gz"), "--quiet")
    _assert_one_line(result, "refusing")
    outside = tmp_path / "x.json.gz"
    assert _run(model, "snapshot", str(model), "-o", str(outside), "--quiet").returncode == 0 and outside.exists()
