"""A Progress (ckptinspect/progress.py) that keeps every phase it hears, for the tests."""

from __future__ import annotations


class RecordingProgress:
    def __init__(self) -> None:
        self.heard: list[tuple[str, int | None, int | None]] = []
        self.ended = 0

    def phase(self, name, done=None, total=None) -> None:
        self.heard.append((name, done, total))

    def end(self) -> None:
        self.ended += 1
