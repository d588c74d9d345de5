"""Progress over the whole wait of a read: the phases of a Hub read (repo info, index, headers n/N) and the
scan of the headers (scanning headers n/N: a long local scan), on one self-overwriting line of stderr.

The stages that wait report to a ``Progress`` (any object with ``phase`` and ``end``); the library's default
is ``SILENT``. The CLI passes ``progress=True`` only when stderr is a terminal, ``--quiet`` is not given and
``HF_HUB_DISABLE_PROGRESS_BARS`` is unset (cli/options.py ``progress_enabled``); ``as_progress`` turns that
into a ``TerminalProgress`` on stderr, and checks the terminal again, so a library caller passing True with
stderr redirected gets nothing either. Nothing is ever written to stdout, so JSON output stays clean.

Drawing costs microseconds and happens at most ``MAX_DRAWS_PER_S`` times a second for counts (a new
phase is drawn at once): a 94-shard read draws a few lines, a 400k-tensor scan never waits for the
terminal. Text from the checkpoint reference is escaped (ckptinspect/escape.py) before it is drawn.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Protocol, TextIO, runtime_checkable

from ckptinspect.escape import escape_controls

MAX_DRAWS_PER_S = 4
_CLEAR_LINE = "\r\x1b[K"


@runtime_checkable
class Progress(Protocol):
    """Where a stage reports what it is waiting for."""

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        """Now in phase ``name`` (e.g. "headers"), ``done`` of ``total`` items when counted."""

    def end(self) -> None:
        """The wait is over: remove what was drawn."""


class _Silent:
    """Reports nothing (the library's default)."""

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        pass

    def end(self) -> None:
        pass


SILENT: Progress = _Silent()


class TerminalProgress:
    """One line on a terminal, redrawn in place (``\\r`` and erase-to-end-of-line), cleared by ``end``.

    Args:
        stream: a terminal (stderr); nothing is written when it is not one.
        label: what is being read (a repo id, a directory), shown first.
        clock: seconds, for the draw rate (tests pass a fake one).
    """

    def __init__(self, stream: TextIO, label: str = "", clock: Any = time.monotonic) -> None:
        self.stream = stream
        self.label = escape_controls(label)
        self.clock = clock
        self.last_phase: str | None = None
        self.last_draw = float("-inf")
        self.drawn = False

    def phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        now = self.clock()
        if name == self.last_phase and now - self.last_draw < 1.0 / MAX_DRAWS_PER_S and done != total:
            return
        self.last_phase, self.last_draw = name, now
        count = f" {done}/{total}" if done is not None and total is not None else ""
        text = f"{self.label}: {name}{count}" if self.label else f"{name}{count}"
        self._write(_CLEAR_LINE + text[:max(10, _columns(self.stream) - 1)])
        self.drawn = True

    def end(self) -> None:
        if self.drawn:
            self._write(_CLEAR_LINE)
            self.drawn = False
        self.last_phase = None

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken terminal: progress is never worth an error
            pass


def as_progress(value: "Progress | bool | None", label: str = "", stream: TextIO | None = None) -> Progress:
    """The reporter for a ``progress=`` argument: a Progress as it is; True: a TerminalProgress on stderr
    when stderr is a terminal (else SILENT); False / None: SILENT."""
    if isinstance(value, Progress):
        return value
    if not value:
        return SILENT
    stream = sys.stderr if stream is None else stream
    return TerminalProgress(stream, label) if _is_terminal(stream) else SILENT


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def _columns(stream: Any) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80
