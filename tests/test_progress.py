"""Progress over the whole wait (issue 26 item 8; ckptinspect/progress.py): drawn on a terminal only (a
pseudo-terminal here), never into a pipe, escaped, at most a few draws a second, ended on every path;
the local scan reports scanning headers n/N. The CLI's side (a real `report` on a pty, with --quiet, piped) is in
tests/test_cli_conventions.py."""

from __future__ import annotations

import os

import pytest

from ckptinspect.pipeline import build_report
from ckptinspect.progress import MAX_DRAWS_PER_S, SILENT, TerminalProgress, as_progress
from recording_progress import RecordingProgress


def _read_all(fd: int) -> bytes:
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_terminal_gets_one_line_redrawn_and_cleared():
    import pty

    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        progress = as_progress(True, label="org/name", stream=terminal)
        assert isinstance(progress, TerminalProgress)
        progress.phase("repo info")
        progress.phase("index")
        for done in range(4):
            progress.phase("headers", done, 3)
        progress.end()
        shown = _read_all(master).decode()
    os.close(master)
    assert "org/name: repo info" in shown and "org/name: index" in shown
    assert "org/name: headers 0/3" in shown and "org/name: headers 3/3" in shown
    assert "\n" not in shown  # one line, redrawn in place
    assert shown.endswith("\r\x1b[K")  # and cleared at the end, so output starts on a clean line


def test_a_pipe_or_no_request_gets_nothing():
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe:
        assert as_progress(True, label="org/name", stream=pipe) is SILENT
        assert as_progress(False, stream=pipe) is SILENT and as_progress(None, stream=pipe) is SILENT
        as_progress(True, stream=pipe).phase("headers", 1, 2)
    assert os.read(read_end, 100) == b""
    os.close(read_end)
    recorder = RecordingProgress()
    assert as_progress(recorder) is recorder  # a caller's own reporter is used as it is


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Stream:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def test_counts_are_drawn_a_few_times_a_second_at_most():
    clock, stream = _Clock(), _Stream()
    progress = TerminalProgress(stream, "r", clock=clock)
    total = 10_000
    for done in range(total + 1):  # 10,000 headers in 2 seconds
        clock.now = 2.0 * done / total
        progress.phase("headers", done, total)
    draws = len(stream.writes)
    assert 2 <= draws <= 2 * MAX_DRAWS_PER_S + 2  # the first, a few per second, the last
    assert stream.writes[-1].endswith(f"headers {total}/{total}")
    progress.phase("scan")  # a new phase is drawn at once
    assert stream.writes[-1].endswith("r: scan") and len(stream.writes) == draws + 1


def test_terminal_controls_in_the_label_are_escaped():
    stream = _Stream()
    progress = TerminalProgress(stream, "org/\x1b]0;owned\x07name")
    progress.phase("index")
    drawn = stream.writes[-1]
    assert "\x1b]" not in drawn and "\x07" not in drawn and "\\x1b]0;owned\\x07" in drawn


def test_a_local_scan_reports_headers_n_of_n_and_ends(make_fixture):
    path = make_fixture("qwen3_5_moe_nvfp4")
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    recorder = RecordingProgress()
    report = build_report(str(path), progress=recorder)
    assert len(report.checkpoint.inventory.shards) == len(shards)
    assert recorder.heard == [("scanning headers", n, len(shards)) for n in range(len(shards))]
    assert recorder.ended == 1


def test_the_line_ends_when_the_scan_fails(make_fixture, tmp_path):
    import shutil

    from ckptinspect.errors import CkptInspectError

    broken = tmp_path / "broken"
    shutil.copytree(make_fixture("qwen3_5_moe_nvfp4"), broken)
    shard = sorted(broken.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:20])  # a truncated header
    recorder = RecordingProgress()
    with pytest.raises(CkptInspectError):
        build_report(str(broken), progress=recorder)
    assert recorder.ended == 1
