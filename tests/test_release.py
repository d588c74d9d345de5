"""The release artefacts: the wheel and the sdist a release publishes, built as a release builds them,
installed alone into a fresh virtual environment, answer as the editable checkout does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT
from fixtures.replica import build_replica
from hub_server import HubServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and the sdist of this checkout (`python -m build`, the backend installed from the lock)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out),
                           str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("ckptinspect-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel_env(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the built wheel (not editable). Its dependencies come from this
    test environment's site-packages through a .pth line, which Python appends after the fresh
    environment's own site-packages and which processes no .pth file of the test environment, so the
    editable install's path hook is not active there: ckptinspect can only come from the wheel."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "test-environment-dependencies.pth").write_text("\n".join(sorted(deps)) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", "--disable-pip-version-check", str(_wheel(dist))], check=True, timeout=600)
    return venv


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CKPTINSPECT_DEBUG")}
    env.update(extra)
    return env


def _run(program: list[str], *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*program, *args], capture_output=True, text=True, cwd=str(cwd), env=_env(**env),
                          timeout=600)


def test_the_wheel_holds_the_package_data(dist: Path):
    names = set(zipfile.ZipFile(_wheel(dist)).namelist())
    assert "ckptinspect/py.typed" in names
    rules = {str(p.relative_to(ROOT / "rules")) for p in (ROOT / "rules").rglob("*") if p.is_file()}
    assert rules and {f"ckptinspect/_rules/{r}" for r in rules} <= names, sorted(rules)[:5]
    examples = {str(p.relative_to(ROOT)) for p in (ROOT / "ckptinspect" / "examples").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert examples <= names
    schemas = {str(p.relative_to(ROOT)) for p in (ROOT / "ckptinspect").rglob("*.schema.json")}
    assert schemas and schemas <= names
    metadata = zipfile.ZipFile(_wheel(dist)).read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"Requires-Python: {project['requires-python']}".encode() in metadata


def test_the_sdist_rebuilds_the_same_wheel(dist: Path, tmp_path: Path):
    """What a packager does with the sdist: unpack it and build the wheel from it, with the same files."""
    (sdist,) = dist.glob("ckptinspect-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (tree,) = tmp_path.iterdir()
    assert (tree / "CHANGELOG.md").is_file() and (tree / "requirements" / "dev.lock").is_file()
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path / "w"),
                           str(tree)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (rebuilt,) = (tmp_path / "w").glob("*.whl")
    assert sorted(zipfile.ZipFile(rebuilt).namelist()) == sorted(zipfile.ZipFile(_wheel(dist)).namelist())


def test_the_installed_wheel_is_the_one_imported(wheel_env: Path, tmp_path: Path):
    done = _run([str(wheel_env / "bin" / "python"), "-c", "import ckptinspect; print(ckptinspect.__file__)"],
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(wheel_env), done.stdout


def test_the_wheel_answers_as_the_editable_install(wheel_env: Path, tmp_path: Path):
    """`report` on the bundled example and `rules list`: the same bytes from both installs. Each runs from
    the folder that holds its package, so the example's path reads the same (ckptinspect/examples/...)."""
    wheel_cli = [str(wheel_env / "bin" / "ckptinspect")]
    here_cli = [sys.executable, "-m", "ckptinspect"]
    find = "import ckptinspect.examples as e; print(e.EXAMPLE_DIR)"
    wheel_example = Path(_run([str(wheel_env / "bin" / "python"), "-c", find], cwd=tmp_path).stdout.strip())
    assert wheel_example.is_relative_to(wheel_env)
    wheel_site = wheel_example.parents[2]
    for args in (["report"], ["report", "--format", "json"], ["rules", "list"], ["rules", "list", "--format", "json"]):
        from_wheel = _run(wheel_cli, *args, cwd=wheel_site, COLUMNS="100")
        from_checkout = _run(here_cli, *args, cwd=ROOT, COLUMNS="100", PYTHONPATH=str(ROOT))
        assert from_wheel.returncode == from_checkout.returncode == 0, (args, from_wheel.stderr)
        assert from_wheel.stdout == from_checkout.stdout, args


def test_the_wheel_reads_the_hub_plans_and_audits(wheel_env: Path, tmp_path: Path, make_fixture):
    """report, plan and audit from the wheel against the test Hub server, equal to the checkout's."""
    wheel_cli = [str(wheel_env / "bin" / "ckptinspect")]
    here_cli = [sys.executable, "-m", "ckptinspect"]
    with HubServer() as server:
        server.add_repo("org/qwen", make_fixture("qwen3_5_moe_nvfp4"))
        # the reduced-scale replica keeps the real widths, so plans pass the engines' divisibility checks
        server.add_repo("org/q397", build_replica(tmp_path / "replica", layers=4, experts=8, shards=3))
        env = {"HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf"), "CKPTINSPECT_HEADER_CACHE": "0",
               "COLUMNS": "100"}
        answered = []
        for args in (["report", "org/qwen", "--format", "json"],
                     ["plan", "org/q397", "--gpu", "h200", "--gpus", "8", "--format", "json"],
                     ["audit", "org/qwen", "org/q397", "--gpu", "8x h200", "--format", "jsonl", "--no-cache"]):
            from_wheel = _run(wheel_cli, *args, cwd=tmp_path, **env)
            from_checkout = _run(here_cli, *args, cwd=tmp_path, PYTHONPATH=str(ROOT), **env)
            assert from_wheel.returncode == from_checkout.returncode, (args, from_wheel.stderr, from_checkout.stderr)
            assert from_wheel.stderr == from_checkout.stderr, args
            if from_wheel.stdout or from_checkout.stdout:
                assert _comparable(from_wheel.stdout) == _comparable(from_checkout.stdout), args
            answered.append(from_wheel.returncode)
    assert answered == [0, 0, 0], answered


def _comparable(out: str) -> list:
    """The JSON documents of one output, less what differs between any two runs (request counts, timings)."""
    try:
        docs = [json.loads(out)]
    except json.JSONDecodeError:  # JSON lines (audit --format jsonl)
        docs = [json.loads(line) for line in out.splitlines() if line.strip()]
    for doc in docs:
        for holder in (doc, doc.get("report") or {}):
            if isinstance(holder.get("source"), dict):
                holder["source"].pop("stats", None)
        doc.pop("elapsed_s", None)
    # audit --format jsonl writes each repo's line as it finishes (cli/audit_cmd.py): the order is the network's
    return sorted(docs, key=lambda d: json.dumps(d, sort_keys=True)) if len(docs) > 1 else docs
