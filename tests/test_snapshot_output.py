"""`snapshot -o` never writes into a model directory or any HF cache repo folder, and a failed write is
one error line that leaves no temporary file (issue 26, hostile round 3: snapshot output)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _snapshot(model: Path | str, output: Path | str, *, preexec=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CKPTINSPECT_DEBUG"}
    return subprocess.run([sys.executable, "-m", "ckptinspect", "snapshot", str(model), "-o", str(output), "-q"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120, preexec_fn=preexec)


def _one_line(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-600:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr[-600:]


def _cache_repo(root: Path) -> Path:
    """An HF cache repo folder with the real layout (blobs, refs/main, snapshots/<commit>/)."""
    repo = root / "hub" / "models--other--repo"
    commit = "c" * 40
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    return repo


@pytest.mark.parametrize("where", ["blobs", "snapshots/" + "c" * 40, "."])
def test_another_cache_repos_folders_are_refused(tmp_path, make_fixture, where):
    repo = _cache_repo(tmp_path)
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    r = _snapshot(make_fixture("deepseek_v3_nvfp4"), repo / where / "x.json.gz")
    _one_line(r, "Hugging Face cache repo folder")
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before


def test_a_snapshot_of_a_snapshot_is_not_written_into_the_original_directory(tmp_path, make_fixture):
    model = tmp_path / "model"
    shutil.copytree(make_fixture("deepseek_v3_nvfp4"), model)
    first = tmp_path / "first.json.gz"
    assert _snapshot(model, first).returncode == 0
    listing = sorted(os.listdir(model))
    r = _snapshot(first, model / "second.json.gz")
    _one_line(r, "the directory the snapshot was taken of")
    assert sorted(os.listdir(model)) == listing


def test_an_unwritable_output_path_is_one_line(tmp_path, make_fixture):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = _snapshot(make_fixture("deepseek_v3_nvfp4"), blocker / "out.json.gz")
    _one_line(r, "cannot write the snapshot")


def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path, make_fixture):
    """A file-size limit stands in for a full disk: the write fails part-way (EFBIG, as ENOSPC would)."""
    out = tmp_path / "out"
    out.mkdir()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    r = _snapshot(make_fixture("deepseek_v3_nvfp4"), out / "s.json.gz", preexec=limit)
    _one_line(r, "cannot write the snapshot")
    assert os.listdir(out) == []
