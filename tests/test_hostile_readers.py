"""Files ckptinspect reads and writes, round 4 (issue 36, cause 3 and the "also failing" list): every
file goes through the guarded reader, no output lands in a model directory, config values and GPU
figures are type-checked, and a GGUF file that shrinks while it is read is an error line, not SIGBUS.

Every case runs the CLI in a subprocess under an address-space limit of 1 GiB and a time limit, and
must end with exit 2 and one `error:` line, no traceback, and nothing written where it must not be."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LIMIT_BYTES = 1 << 30
TIME_LIMIT_S = 120  # a hang guard on a loaded machine; every case ends in seconds


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def _run(*args: str, env: dict | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"}
    full.update(env or {})
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "ckptinspect", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=full, timeout=TIME_LIMIT_S,
                          preexec_fn=_limit_memory)


def _one_error_line(done: subprocess.CompletedProcess, needle: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], done.stderr[-1500:]
    assert "Traceback" not in done.stderr


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


# -- audit --repos-file ------------------------------------------------------------------------------------
def _repos_file_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    cases = {"dev-zero": ("/dev/zero", "not a regular file"),
             "sparse-2gib": (str(_sparse(tmp_path / "sparse.txt", 2 << 30)), "over the"),
             "binary": (str(tmp_path / "bin.txt"), "not valid UTF-8"),
             "million-ids": (str(tmp_path / "ids.txt"), "over the"),
             "control-chars": (str(tmp_path / "esc.txt"), "not a repo id")}
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00org/x\n")
    (tmp_path / "ids.txt").write_text("".join(f"org/model-{i}\n" for i in range(1_000_000)))
    (tmp_path / "esc.txt").write_text("org/x\x1b]0;owned\x07\n")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.txt")
        cases["fifo"] = (str(tmp_path / "fifo.txt"), "not a regular file")
    return cases


@pytest.mark.parametrize("case", ["dev-zero", "sparse-2gib", "binary", "million-ids", "control-chars", "fifo"])
def test_audit_repos_file_is_read_through_the_guarded_reader(tmp_path, case):
    cases = _repos_file_cases(tmp_path)
    if case not in cases:
        pytest.skip("needs FIFOs")
    path, needle = cases[case]
    done = _run("audit", "--repos-file", path, "--no-cache", env={"HF_HUB_OFFLINE": "1"})
    _one_error_line(done, needle)
    assert "\x1b" not in done.stderr


def test_a_repos_file_over_the_id_count_is_refused(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("".join(f"o/{i}\n" for i in range(100_001)))  # under the byte cap, over the id cap
    _one_error_line(_run("audit", "--repos-file", str(ids), "--no-cache"), "more than 100,000 repo ids")


# -- the probe's input files -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def probe_model() -> str:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "fixtures" / "probe"))
    import build_fixtures

    return build_fixtures.fixture_dir("qwen35moe")


def _probe(model: str, *args: str) -> subprocess.CompletedProcess:
    return _run("probe", model, "--device", "cpu", "--max-prompts", "1", "--max-new-tokens", "4", *args)


def _calibration_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "nan.json").write_text('{"bandwidth_efficiency": NaN, "flop_efficiency": 0.5}')
    (tmp_path / "huge.json").write_text('{"bandwidth_efficiency": 1' + "0" * 4000 + ', "flop_efficiency": 0.5}')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "list.json").write_text("[1, 2]")
    cases = {"dev-zero": ("/dev/zero", "not a regular file"),
             "nan": (str(tmp_path / "nan.json"), "cost calibration"),
             "huge-int": (str(tmp_path / "huge.json"), "cost calibration"),
             "deep": (str(tmp_path / "deep.json"), "deep.json"),
             "not-an-object": (str(tmp_path / "list.json"), "not a cost calibration file")}
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.json")
        cases["fifo"] = (str(tmp_path / "fifo.json"), "not a regular file")
    return cases


@pytest.mark.parametrize("case", ["dev-zero", "nan", "huge-int", "deep", "not-an-object", "fifo"])
def test_probe_cost_calibration_is_guarded(probe_model, tmp_path, case):
    cases = _calibration_cases(tmp_path)
    if case not in cases:
        pytest.skip("needs FIFOs")
    path, needle = cases[case]
    _one_error_line(_probe(probe_model, "--cost-calibration", path), needle)


@pytest.mark.parametrize("case", ["deep", "huge-int", "binary"])
def test_probe_jsonl_prompts_are_bounded(probe_model, tmp_path, case):
    prompts = tmp_path / "p.jsonl"
    if case == "deep":
        prompts.write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    elif case == "huge-int":
        prompts.write_text('{"prompt": "x", "n": 1' + "0" * 5000 + "}\n")
    else:
        prompts.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    _one_error_line(_probe(probe_model, "--prompts", str(prompts)), str(prompts))


@pytest.mark.parametrize("case", ["binary", "deep", "not-objects", "fifo"])
def test_probe_continuations_are_guarded(probe_model, tmp_path, case):
    cont = tmp_path / "c.jsonl"
    if case == "binary":
        cont.write_bytes(b"\x00\xff" * 1000)
    elif case == "deep":
        cont.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    elif case == "not-objects":
        cont.write_text('[1]\n[2]\n')
    else:
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs FIFOs")
        os.mkfifo(cont)
    done = _probe(probe_model, "--mode", "teacher", "--continuations", str(cont))
    _one_error_line(done, str(cont))


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",  # 10^10 steps
    "{{ 'x' * 10 ** 10 }}",
])
def test_a_chat_template_bomb_is_one_line_within_the_memory_limit(probe_model, tmp_path, template):
    model = tmp_path / "model"
    shutil.copytree(probe_model, model)
    (model / "chat_template.jinja").write_text(template)
    done = _probe(str(model))
    _one_error_line(done, "chat template")


# -- outputs never land in the model directory -------------------------------------------------------------
@pytest.mark.parametrize("flag", ["-o", "--plot", "--save-continuations"])
@pytest.mark.parametrize("where", ["inside", "via-symlink", "trailing-slash"])
def test_probe_outputs_never_land_in_the_model_directory(probe_model, tmp_path, flag, where):
    model = tmp_path / "model"
    shutil.copytree(probe_model, model)
    before = sorted(p.name for p in model.iterdir())
    if where == "inside":
        target = str(model / "out.json")
    elif where == "via-symlink":
        (tmp_path / "link").symlink_to(model)
        target = str(tmp_path / "link" / "out.json")
    else:
        target = str(tmp_path / "out.json") + "/"
    done = _probe(str(model), flag, target)
    _one_error_line(done, "refusing to write" if where != "trailing-slash" else "path separator")
    assert sorted(p.name for p in model.iterdir()) == before
    assert not (tmp_path / "out.json").exists()


def test_snapshot_output_with_a_trailing_slash_is_an_error(tmp_path, make_fixture):
    out = tmp_path / "x.json.gz"
    done = _run("snapshot", str(make_fixture("deepseek_v3_fp8")), "-o", str(out) + "/")
    _one_error_line(done, "must end with .json.gz")
    assert not out.exists()


def test_the_library_snapshot_refuses_a_trailing_slash_too(tmp_path, make_fixture):
    from ckptinspect import api
    from ckptinspect.errors import CkptInspectError

    with pytest.raises(CkptInspectError, match="must end with .json.gz"):
        api.snapshot(str(make_fixture("deepseek_v3_fp8")), str(tmp_path / "x.json.gz") + "/")
    assert not (tmp_path / "x.json.gz").exists()


# -- config values the planner and readiness read ----------------------------------------------------------
@pytest.mark.parametrize("fixture,key,value", [
    ("deepseek_v32_fp8", "index_head_dim", [128]),
    ("deepseek_v32_fp8", "index_topk", "2048"),
    ("deepseek_v32_fp8", "num_nextn_predict_layers", {"n": 1}),
    ("deepseek_v32_fp8", "compress_ratios", 4),
    ("deepseek_v32_fp8", "compress_ratios", [4, "x"]),
    ("deepseek_v32_fp8", "index_head_dim", 10 ** 40),
])
def test_config_values_of_the_wrong_type_are_one_line_naming_the_key(make_fixture, tmp_path, fixture, key, value):
    model = tmp_path / "m"
    shutil.copytree(make_fixture(fixture), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg[key] = value
    (model / "config.json").write_text(json.dumps(cfg))
    for cmd in (("report",), ("plan", "--gpu", "h200", "--gpus", "8")):
        done = _run(cmd[0], str(model), *cmd[1:])
        _one_error_line(done, f"{key} must be a")
        assert "config.json" in done.stderr


# -- GPU spec files ----------------------------------------------------------------------------------------
_CARD = """schema_version: 1
gpus:
  - name: Odd-GPU
    aliases: [odd]
    vendor: nvidia
    arch: sm90
    compute_capability: "9.0"
    memory_gib: {memory}
    bandwidth_tbps: {bandwidth}
    tflops: {{bf16: {tflops}, fp8: 1979, fp4: null}}
    interconnect: nvlink
    source: test
"""


@pytest.mark.parametrize("memory,bandwidth,tflops", [
    (".inf", "3.35", "989"), ("1" + "0" * 4000, "3.35", "989"), (".nan", "3.35", "989"),
    ("80", ".inf", "989"), ("80", "3.35", ".nan"), ("80", "1" + "0" * 4000, "989"),
])
def test_gpu_file_numbers_must_be_finite(make_fixture, tmp_path, memory, bandwidth, tflops):
    spec = tmp_path / "gpus.yaml"
    spec.write_text(_CARD.format(memory=memory, bandwidth=bandwidth, tflops=tflops))
    done = _run("plan", str(make_fixture("deepseek_v3_fp8")), "--gpu", "odd", "--gpus", "8", "--gpu-spec", str(spec),
                "--format", "json")
    _one_error_line(done, "finite number")
    assert str(spec) in done.stderr and "Infinity" not in done.stdout and "NaN" not in done.stdout


# -- a GGUF file that shrinks while it is read ---------------------------------------------------------------
SHRINK_WHILE_READING = r"""
import os, sys
import ckptinspect.sources.gguf_local as local
real = local.parse_gguf
path = sys.argv[1]
def shrink_then_parse(window):
    os.truncate(path, 64 * 1024)  # another process truncates the file after it was opened
    return real(window)
local.parse_gguf = shrink_then_parse
from ckptinspect.cli import main
sys.argv = ["ckptinspect", "report", path]
main()
"""


def test_a_gguf_truncated_while_it_is_read_is_one_line_not_sigbus(tmp_path):
    pytest.importorskip("gguf")
    from fixtures.gguf_models import write_gguf

    path = tmp_path / "model-Q8_0.gguf"
    kv = {"llama.block_count": ("u32", 1), "llama.embedding_length": ("u32", 256),
          "llama.attention.head_count": ("u32", 2), "llama.context_length": ("u32", 4096),
          "tokenizer.ggml.model": ("str", "gpt2"),
          "tokenizer.ggml.tokens": ("strs", [f"token-{i:08d}" for i in range(200_000)])}  # a 3.6 MB header
    tensors = [("token_embd.weight", (256, 256), "Q8_0"), ("blk.0.attn_q.weight", (256, 256), "Q8_0")]
    write_gguf(path, "llama", kv, tensors)
    assert path.stat().st_size > 3 << 20
    done = _run(str(path), code=SHRINK_WHILE_READING)
    assert done.returncode != -7 and done.returncode != 135, "SIGBUS"
    _one_error_line(done, "truncated GGUF header")


def test_a_huge_sparse_rule_file_in_audit_rules_dir_is_one_line(tmp_path, make_fixture):
    """The audit cache hashes --rules-dir files into its key: through the guarded reader (a sparse 4 GiB
    file was read whole: MemoryError)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    _sparse(rules / "huge.yaml", 4 << 30)
    done = _run("audit", str(make_fixture("deepseek_v3_fp8")), "--rules-dir", str(rules),
                env={"CKPTINSPECT_CACHE_DIR": str(tmp_path / "cache"),
                     "CKPTINSPECT_CACHE_KEY_FILE": str(tmp_path / "config" / "cache-key")})
    _one_error_line(done, "huge.yaml")
