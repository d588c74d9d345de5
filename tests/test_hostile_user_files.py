"""Files ckptinspect reads besides the checkpoint, and strings it prints (issue 26, hostile round 3).

Every such file goes through one guarded reader (ckptinspect/guarded_file.py): a FIFO never hangs, a
device or a sparse huge file never fills memory, deep nesting is one error line. Every rendered string
and error line has its control characters escaped (ckptinspect/escape.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptinspect.errors import PlanError, ProbeError, SourceError

REPO = Path(__file__).resolve().parent.parent
UNSAFE = ("\x1b", "\x07", "\r", "\x08", "\u202e", "\x9b")


def _run(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    full.pop("CKPTINSPECT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, cwd=REPO,
                          env=full, timeout=timeout)


def _one_error_line(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, r.stderr[-800:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr[-800:]


# -- the guarded reader, through each file it guards ---------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_probe_report_fifo_does_not_hang(tmp_path, make_fixture):
    fifo = tmp_path / "probe.json"
    os.mkfifo(fifo)
    r = _run("plan", str(make_fixture("deepseek_v3_nvfp4")), "--gpu", "h200", "--gpus", "8",
             "--probe-report", str(fifo), timeout=60)
    _one_error_line(r, "not a regular file")


def test_deeply_nested_probe_report_is_one_line(tmp_path, make_fixture):
    deep = tmp_path / "probe.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    r = _run("plan", str(make_fixture("deepseek_v3_nvfp4")), "--gpu", "h200", "--gpus", "8",
             "--probe-report", str(deep))
    _one_error_line(r, str(deep))


def test_huge_sparse_probe_report_is_refused_before_reading(tmp_path):
    from ckptinspect.api import read_probe_report

    sparse = tmp_path / "probe.json"
    with open(sparse, "wb") as fh:
        fh.truncate(4 * 1024**3)  # 4 GB on paper, nothing on disk
    with pytest.raises(PlanError, match="over the .*-byte cap"):
        read_probe_report(sparse)
    with pytest.raises(PlanError, match="not a regular file"):
        read_probe_report(Path("/dev/zero"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_hf_cache_ref_fifo_or_device_is_an_error_not_a_hang(tmp_path):
    """refs/<revision> of the HF cache: a FIFO or a link to /dev/zero must not hang or fill memory."""
    code = ("import sys; from ckptinspect.sources.hf_cache import resolve_commit\n"
            "try:\n    print(resolve_commit('org/name', sys.argv[1]))\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    refs = tmp_path / "hub" / "models--org--name" / "refs"
    refs.mkdir(parents=True)
    os.mkfifo(refs / "main")
    os.symlink("/dev/zero", refs / "zero")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "home")}
    for rev in ("main", "zero"):
        r = subprocess.run([sys.executable, "-c", code, rev], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=60)
        assert r.stdout.startswith("SourceError") and "not a regular file" in r.stdout, (rev, r.stdout, r.stderr)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_probe_prompt_and_tokenizer_files_are_guarded(tmp_path):
    from ckptinspect.probe.prompts import check_tokenizer_files, load_corpus, load_prompts

    fifo = tmp_path / "prompts.txt"
    os.mkfifo(fifo)
    with pytest.raises(ProbeError, match="not a regular file"):
        load_prompts(str(fifo))
    with pytest.raises(ProbeError, match="not a regular file"):
        load_corpus(str(fifo))
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ProbeError, match="tokenizer.json"):
        check_tokenizer_files(str(model), os.listdir(model))
    (model / "tokenizer.json").write_text("{}")
    os.mkfifo(model / "chat_template.jinja")
    with pytest.raises(ProbeError, match="chat_template.jinja: .*not a regular file"):
        check_tokenizer_files(str(model), os.listdir(model))


def test_a_raising_chat_template_is_one_probe_error():
    from ckptinspect.probe.prompts import Prompt, encode_prompt

    class Tokenizer:
        chat_template = "{{ raise_exception('no') }}"

        def apply_chat_template(self, *args, **kwargs):
            raise RuntimeError("template raised\nsecond line")

    with pytest.raises(ProbeError, match="chat template fails") as err:
        encode_prompt(Tokenizer(), Prompt("chat", "hi"), chat=True, vocab_size=10, source="m")
    assert "\n" not in str(err.value)


# -- terminal injection -------------------------------------------------------------------------------
def _hostile_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["Deepseek\x1b]0;owned\x07V3\rForCausalLM\u202e"]
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_control_characters_from_config_never_reach_the_terminal(tmp_path, make_fixture, fmt):
    model = _hostile_copy(make_fixture("deepseek_v3_nvfp4"), tmp_path / "m")
    r = _run("report", str(model), "--format", fmt, "--wide", "--gpu", "h200", "--gpus", "8")
    assert r.returncode == 0, r.stderr[-500:]
    assert not any(c in r.stdout + r.stderr for c in UNSAFE), repr(r.stdout[:400])
    assert "\\x1b]0;owned\\x07V3\\rForCausalLM\\u202e" in r.stdout  # shown, visibly escaped


def test_a_newline_in_a_file_name_cannot_forge_a_second_error_line(tmp_path, make_fixture):
    model = tmp_path / "m"
    shutil.copytree(make_fixture("deepseek_v3_nvfp4"), model)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "gone\nerror: \x1b[2Jeverything is fine.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    r = _run("report", str(model))
    _one_error_line(r, "gone\\nerror: \\x1b[2J")
    assert "\x1b" not in r.stderr


def test_diff_and_plan_text_escape_too(tmp_path, make_fixture):
    a = make_fixture("deepseek_v3_nvfp4")
    b = _hostile_copy(a, tmp_path / "b\x1b[2J\u202e")  # the directory name is printed as the model
    r = _run("diff", str(a), str(b), "--wide")
    assert r.returncode in (0, 1) and not any(c in r.stdout for c in UNSAFE), r.stderr[-300:]
    assert "b\\x1b[2J\\u202e" in r.stdout
    plan = _run("plan", str(b), "--gpu", "h200", "--gpus", "8")
    assert "b\\x1b[2J" in plan.stdout + plan.stderr and not any(c in plan.stdout + plan.stderr for c in UNSAFE)


def test_escape_keeps_safe_text_and_escapes_the_rest():
    from ckptinspect.escape import escape_controls, escaped
    from ckptinspect.records import Finding

    assert escape_controls("model.layers.0.mlp — ok ✓") == "model.layers.0.mlp — ok ✓"
    assert escape_controls("a\x1b[31mb\n\u2028") == "a\\x1b[31mb\\n\\u2028"
    f = Finding("code", "error", "plain")
    assert escaped(f) is f  # nothing to escape: no copy
    assert escaped((f, {"k\x07": ["v\r"]}))[1] == {"k\\x07": ["v\\r"]}
    assert SourceError("bad\nline", path="dir\x1b").args[0] == "dir\\x1b: bad\\nline"


def test_usage_errors_quote_arguments_escaped():
    r = _run("report", "x", "--format", "\x1b[2Jevil\x07")
    assert r.returncode == 2 and "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
