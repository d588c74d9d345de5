"""Draft checkpoints in a subfolder of the checkpoint (MiniMax-M3's ``dspark/``): which ones a source reads.

Which subfolders hold a draft is rule data (a family's ``draft_subfolders``), so a source does not decide it:
the pipeline hands it a ``SubfolderChooser``, called with the parsed config.json once the source has read it,
that returns the subfolder names to read (pipeline.py ``draft_subfolder_chooser``). A source reads a named
subfolder only when its listing has ``<name>/config.json``, with the same readers, client and limits as the
checkpoint itself, into ``RawCheckpoint.subfolders[name]``; a name it lacks is simply not there (the report
then says the draft is absent).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

SubfolderChooser = Callable[[Any], Iterable[str]]


def chosen(chooser: SubfolderChooser | None, config: Any, files: Iterable[str]) -> list[str]:
    """The names ``chooser`` asks for that ``files`` (the checkpoint's relative names) holds a config.json in."""
    if chooser is None or config is None:
        return []
    present = set(files)
    out: list[str] = []
    for name in chooser(config):
        if isinstance(name, str) and "/" not in name and name not in (".", "..") and name not in out \
                and f"{name}/config.json" in present:
            out.append(name)
    return out
