"""Where `snapshot -o` and the probe's `-o`, `--plot` and `--save-continuations` may write: never into a
model directory or a Hugging Face cache repo folder, and never to a path that names a directory.

Checked against the resolved output path (symlinks followed), whatever the source: a snapshot of a
Hub repo written into *another* repo's ``blobs/`` or ``snapshots/<commit>/`` corrupts that cache entry
(blobs are content-addressed, snapshot files are links into them) as surely as one written into its
own; and a snapshot of a snapshot must not land in the directory the first one was taken of. An
unwritable path or a full disk is one error line; sources/snapshot.py removes its temporary file on
every failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from ckptinspect.errors import CkptInspectError, SourceError

HF_CACHE_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def refuse_directory_name(output: str | os.PathLike, what: str = "snapshot") -> None:
    """CkptInspectError when ``output`` ends in a path separator: ``x.json.gz/`` names a directory, and
    ``pathlib`` would drop the slash and write a file named ``x.json.gz``."""
    text = os.fspath(output)
    if text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
        raise CkptInspectError(f"the {what} output path ends in a path separator (it names a directory, "
                               "not a file)", path=text)


def refuse_protected_output(raw: Any, output: Path) -> None:
    """SourceError when ``output`` lies in the model directory (of the source or, for a snapshot, of
    what it was taken of) or in any Hugging Face cache repo folder."""
    refuse_output_in(_protected(raw), output, "a snapshot")


def refuse_output_in(protected: Iterable[tuple[Path, str]], output: str | os.PathLike, what: str) -> None:
    """SourceError when ``output`` (resolved, symlinks followed) lies in one of the ``protected``
    (directory, description) pairs or in any Hugging Face cache repo folder; ``what`` names the file."""
    refuse_directory_name(output, what.removeprefix("a ").removeprefix("the "))
    target = Path(output).expanduser().resolve()
    for folder, description in protected:
        if target == folder or folder in target.parents:
            raise SourceError(f"refusing to write {what} into {description}", path=str(output),
                              hint="choose an output path outside it")
    for folder in target.parents:
        if folder.name.startswith(HF_CACHE_REPO_PREFIXES) and any(
                (folder / sub).is_dir() for sub in ("snapshots", "blobs", "refs")):
            raise SourceError(f"refusing to write {what} into a Hugging Face cache repo folder",
                              path=str(output), hint="choose an output path outside the HF cache")


def refuse_output_in_model_dir(model_dir: str | os.PathLike, output: str | os.PathLike, what: str) -> None:
    """``refuse_output_in`` for one model directory (the probe's checkpoint)."""
    refuse_output_in([(Path(model_dir).expanduser().resolve(), "the model directory")], output, what)


def refuse_probe_outputs(ref: str, outputs: Mapping[str, str | None]) -> None:
    """``refuse_output_in`` for each of the probe's output files (flag -> path, None skipped): the model
    directory when ``ref`` is one (a repo id's weights are in the HF cache, whose folders are refused
    anyway)."""
    model_dir = ref if os.path.isdir(ref) else None
    for flag, path in outputs.items():
        if path:
            protected = [(Path(model_dir).expanduser().resolve(), "the model directory")] if model_dir else []
            refuse_output_in(protected, path, f"the probe's {flag} file")


def _protected(raw: Any) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    if raw.kind in ("local", "hf-cache"):
        found.append((Path(raw.location).resolve(), "the model directory"))
    source = raw.stats.get("snapshot_of") if raw.kind == "snapshot" else None
    if isinstance(source, Mapping) and source.get("kind") in ("local", "hf-cache"):
        location = source.get("location")
        if isinstance(location, str) and location:
            found.append((Path(location).expanduser().resolve(), "the directory the snapshot was taken of"))
    return found


def write_error(exc: OSError, output: Path) -> CkptInspectError:
    """The one error line for a snapshot that could not be written (read-only or missing folder, a file
    where a folder should be, a full disk, a file-size limit)."""
    return CkptInspectError(f"cannot write the snapshot ({exc.strerror or exc})", path=str(output))
