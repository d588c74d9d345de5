"""Issue 34 §4: what a first-time deployer reads must not contradict itself. Each test runs the CLI in a
subprocess and fails on the main branch the issue was filed against."""

from __future__ import annotations

import json
import re

from conftest import ROOT, run_cli

ROOT_EXAMPLE = ROOT / "ckptinspect" / "examples" / "qwen3_5_moe_nvfp4_tiny"


def _share(doc: dict) -> tuple[str, float]:
    schemes, total = doc["quantization"]["schemes"], doc["totals"]["bytes"]
    top = max(schemes, key=lambda k: (schemes[k]["bytes"], k))
    return top, 100 * schemes[top]["bytes"] / total


def test_stored_quantization_is_shown_beside_the_declared_one(make_fixture) -> None:
    """A config may declare another scheme than the weights hold (DeepSeek-V4 NVFP4 said "fp8"): the
    summary and audit's quant column show what is stored, by share of bytes, next to the declaration."""
    model = str(make_fixture("deepseek_v4_flash_nvfp4"))
    doc = json.loads(run_cli("report", model, "--format", "json", "--quiet").stdout)
    top, share = _share(doc)
    label = f"{top} {share:.1f}%"
    text = run_cli("report", model, "--quiet", "--wide").stdout
    assert re.search(rf"Declared quantization\s+{re.escape(doc['quantization']['declared'])}\n", text)
    assert re.search(rf"Stored \(share of bytes\)\s+{re.escape(label)}", text), text[:1500]
    audit = run_cli("audit", model, "--no-cache", "--quiet", "--wide")
    assert audit.returncode == 0, audit.stderr
    assert f"{doc['quantization']['declared']} / {label}" in audit.stdout


def test_audit_and_report_print_the_same_bytes_in_the_same_unit(make_fixture) -> None:
    model = str(make_fixture("deepseek_v4_flash_nvfp4"))
    report = run_cli("report", model, "--quiet", "--wide").stdout
    size = re.search(r"Tensors / params / size\s+\S+ / \S+ / (\S+ \S+)", report).group(1)
    assert size.endswith("iB")  # binary: KiB / MiB / GiB
    audit = run_cli("audit", model, "--no-cache", "--quiet", "--wide").stdout
    assert f" {size} " in audit and not re.search(r"\d (kB|MB|GB|TB) ", audit)


def test_audit_fit_never_says_yes_with_a_minimum_above_what_it_uses(qwen35_replica) -> None:
    """main: "yes, 4 used, min 8" (`fits: true, min_gpus: 8, gpus_used: 4`) for the 397B NVFP4 replica on
    4x H100 at a 1M-token context, which runs there only with the max-context solver's settings."""
    args = ("audit", str(qwen35_replica), "--gpu", "h100", "--gpus", "4", "--context", "1000000", "--no-cache",
            "--quiet")
    doc = json.loads(run_cli(*args, "--format", "json", timeout=300).stdout)
    fit = doc["rows"][0]["fit"]
    assert fit["fits"] is True and fit["min_gpus"] <= fit["gpus_used"] == 4, fit
    assert "solver" in fit["reason"] and "8 GPUs" in fit["reason"]
    text = run_cli(*args, "--wide", timeout=300).stdout
    assert "yes, 4 used (solver settings)" in text and "min 8" not in text


def test_gpu_suggestions_never_name_another_product_and_find_the_alias() -> None:
    gh = run_cli("plan", "x", "--gpu", "gh200", "--gpus", "1")
    assert gh.returncode == 2 and "did you mean" not in gh.stderr  # GH200 is Grace Hopper, not an H200
    rtx = run_cli("plan", "x", "--gpu", "rtx6000", "--gpus", "1")
    assert rtx.returncode == 2 and "did you mean rtx6000-pro?" in rtx.stderr
    typo = run_cli("plan", "x", "--gpu", "h2000", "--gpus", "1")
    assert "did you mean h200?" in typo.stderr  # a doubled character is still the same card


def test_snapshot_refuses_a_directory_that_does_not_exist(tmp_path) -> None:
    target = tmp_path / "NOSUCHDIR" / "sub" / "x.json.gz"
    done = run_cli("snapshot", "ckptinspect/examples/qwen3_5_moe_nvfp4_tiny", "-o", str(target))
    assert done.returncode == 2 and "does not exist" in done.stderr and "NOSUCHDIR" in done.stderr
    assert not (tmp_path / "NOSUCHDIR").exists()


def test_plan_context_above_the_model_max_sets_the_engines_variable(qwen35_replica) -> None:
    done = run_cli("plan", str(qwen35_replica), "--gpu", "b200", "--gpus", "8", "--context", "2000000", "--quiet",
                   "--wide", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang.launch_server" in done.stdout
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in done.stdout


def test_library_plan_that_cannot_be_made_raises_like_an_unknown_gpu(make_fixture) -> None:
    """main: api.plan returned a PlanFailure (the next `plan.commands` was an AttributeError) while an unknown
    GPU raised; both are PlanError now, the failure record travels on the exception."""
    import pytest

    from ckptinspect import api
    from ckptinspect.errors import CkptInspectError, PlanError, PlanNotPossible

    with pytest.raises(PlanError):
        api.plan(str(make_fixture("qwen3_5_moe_nvfp4")), gpu="no-such-gpu", gpus=8)
    # The tiny example now plans on 8x H200 (TP 2, idle GPUs allowed: plan/memory.py), so the plan that
    # cannot be made is the same model on H200s given 0.5 MiB each: no static pool fits anywhere.
    from dataclasses import replace

    tiny_h200 = replace(api.find_gpu("h200"), memory_gib=0.0005)
    with pytest.raises(PlanNotPossible) as raised:
        api.plan("ckptinspect/examples/qwen3_5_moe_nvfp4_tiny", gpu=tiny_h200, gpus=8)
    assert isinstance(raised.value, CkptInspectError) and raised.value.failure.ok is False
    assert raised.value.failure.options and "does not run on 8x H200-SXM" in str(raised.value)  # the 8 GPUs asked for


def test_the_package_lists_its_public_api_and_ships_type_information() -> None:
    import importlib.resources

    import ckptinspect

    names = dir(ckptinspect)
    for name in ("inspect", "gate", "snapshot", "find_gpu", "api", "CkptInspectError", "PlanNotPossible"):
        assert name in names and name in ckptinspect.__all__
    assert "Any" not in names
    for name in ckptinspect.__all__:
        assert getattr(ckptinspect, name) is not None, name
    assert ckptinspect.PlanNotPossible.__mro__[1].__name__ == "PlanError"
    assert importlib.resources.files("ckptinspect").joinpath("py.typed").is_file()


def _fake_engine(owner: str):
    """A server that answers /v1/models as a vLLM or SGLang server does (owned_by), nothing else."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/v1/models":
                body = json.dumps({"data": [{"id": "m", "owned_by": owner}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_probe_engine_takes_an_engine_name_and_the_address_goes_in_engine_url(qwen35_replica) -> None:
    import pytest

    pytest.importorskip("transformers")
    url = run_cli("probe", "ckptinspect/examples/qwen3_5_moe_nvfp4_tiny", "--engine", "localhost:8000")
    assert url.returncode == 2 and "--engine-url localhost:8000" in url.stderr  # main: "unknown url type"
    closed = run_cli("probe", str(qwen35_replica), "--engine", "vllm", "--engine-url", "127.0.0.1:9")
    assert closed.returncode == 2 and "Traceback" not in closed.stderr  # main: a traceback and exit 1
    assert "127.0.0.1:9" in closed.stderr and "tokenizer" not in closed.stderr  # the server first
    server = _fake_engine("vllm")
    try:
        host, port = server.server_address[:2]
        wrong = run_cli("probe", str(qwen35_replica), "--engine", "sglang", "--engine-url", f"{host}:{port}")
        assert wrong.returncode == 2 and "--engine sglang, but the server at this address is vllm" in wrong.stderr
        # the 94-shard replica has no tokenizer: said before any of its headers is read
        notok = run_cli("probe", str(qwen35_replica), "--engine-url", f"{host}:{port}")
        assert notok.returncode == 2 and "no tokenizer in the checkpoint" in notok.stderr, notok.stderr
    finally:
        server.shutdown()


def test_the_bundled_example_suggests_no_probe_it_cannot_run() -> None:
    """main: the example's report suggested `ckptinspect probe ... --gpu YOUR_GPU`, which fails (no tokenizer)."""
    text = run_cli("report", "--quiet", "--wide").stdout
    line = next(x for x in text.splitlines() if x.startswith("Pays off?"))
    assert "ckptinspect probe ckptinspect/examples" not in line and "needs the model's tokenizer" in line


def test_the_engine_install_notice_is_printed_once_for_all_test_workers(tmp_path) -> None:
    """main: "installing sglang==0.5.23" was printed once per pytest-xdist worker. Four processes racing for
    the same environment (tests/engine_envs.py, pip replaced by a stand-in that takes a second): one line."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys, subprocess, time; sys.path.insert(0, sys.argv[1]); import engine_envs\n"
            "def pip(cmd, **kw):\n    time.sleep(1.0)\n    return subprocess.CompletedProcess(cmd, 0)\n"
            "engine_envs.subprocess.run = pip\n"
            "engine_envs.ensure(engine_envs.SGLANG_QUANT_DEPS, lambda line: print(line, file=sys.stderr))")
    env = dict(os.environ, CKPTINSPECT_TEST_CACHE=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tests")], stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(4)]
    printed = "".join(p.communicate(timeout=60)[1] for p in procs)
    assert printed.count("ckptinspect tests: installing") == 1, printed


def _corrupt_prefix_repo(root, length: int):
    """A one-shard checkpoint whose header length prefix says ``length`` bytes (a corrupt or hostile file)."""
    import shutil
    import struct

    shutil.copytree(ROOT_EXAMPLE, root)
    shard = sorted(root.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", length) + data[8:])
    return shard.name


def test_a_corrupt_header_names_one_cap_locally_and_over_the_hub(tmp_path) -> None:
    """main: the same corrupt prefix named a 100,000,000-byte cap locally and 25,000,000 over the Hub."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from hub_server import HubServer

    repo = tmp_path / "repo"
    _corrupt_prefix_repo(repo, 60_000_000_000)
    local = run_cli("report", str(repo))
    cap = re.search(r"exceeds the cap of ([\d,]+) bytes", local.stderr)
    assert local.returncode == 2 and cap, local.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CKPTINSPECT_"))}
    with HubServer() as server:
        server.add_repo("org/corrupt", repo)
        env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=server.url, PYTHONPATH=str(ROOT))
        hub = subprocess.run([sys.executable, "-m", "ckptinspect", "report", "org/corrupt"], capture_output=True,
                             text=True, env=env, cwd=str(ROOT), timeout=120)
    assert hub.returncode == 2 and f"exceeds the cap of {cap.group(1)} bytes" in hub.stderr, hub.stderr


def test_a_missing_repo_says_what_to_check_and_a_trailing_slash_is_forgiven(tmp_path) -> None:
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from hub_repos import make_sharded_repo
    from hub_server import HubServer

    make_sharded_repo(tmp_path / "repo", shards=2, experts=4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CKPTINSPECT_"))}
    with HubServer() as server:
        server.add_repo("org/real", tmp_path / "repo")
        env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=server.url, PYTHONPATH=str(ROOT))

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "ckptinspect", *args, "--quiet"], capture_output=True,
                                  text=True, env=env, cwd=str(tmp_path), timeout=120)

        typo = cli("report", "org/raal")
        slash = cli("report", "org/real/")
    assert typo.returncode == 2 and len(typo.stderr.strip().splitlines()) == 1
    assert "not found, private or gated? check the spelling" in typo.stderr and "https://" not in typo.stderr
    assert slash.returncode == 0, slash.stderr  # main: "no such directory, and not a Hub repo id"


def test_an_audit_without_network_fails_fast_in_one_line() -> None:
    """main: six huggingface_hub "Retrying in Ns" lines over 27 s before the error; `report` gave one line."""
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    done = run_cli("audit", "--author", "someone", env={"HF_ENDPOINT": f"http://127.0.0.1:{port}"}, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 2 and "Retrying" not in done.stderr
    # the listing goes through the one bounded client (sources/hub_session.py): its attempts, one line
    # naming what failed and the endpoint
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Hub listing failed" in line and f"127.0.0.1:{port}" in line, line
    assert elapsed < 15, elapsed  # the client's few quick attempts (main: 27 s)
