"""A model directory on disk (also the snapshot folders of the Hugging Face cache).

Only config / quantization / index JSON files and each shard's header bytes are read; tensor data,
and anything that deserializes through pickle, is never opened. Nothing is written.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from functools import partial

from ckptinspect.errors import NotFoundError, SourceError
from ckptinspect.records import RawCheckpoint, ScanPlan
from ckptinspect.sources.index_summary import summarize_index_file
from ckptinspect.sources.interface import (
    INDEX, JSON_FILES, SINGLE_FILE, LocalHeaders, LocalSizes, lazy_json_files, shard_names_from_index,
)

# MoE shards of a few GB carry 50-700 kB of header each (0.02-0.03% of the data), so file size is a
# usable proxy for header volume before anything is read.
HEADER_TO_DATA_RATIO = 1 / 4000


def open_local(directory: Path, *, ref: str | None = None, kind: str = "local",
               revision: str | None = None) -> RawCheckpoint:
    """Read a checkpoint directory's metadata (JSON parsed lazily, headers read on demand).

    Raises:
        NotFoundError: the directory, or a shard named by the index, is missing.
        SourceError: unreadable files or symlink loops.
        ConfigError: malformed JSON metadata (when first read).
    """
    ref = ref or str(directory)
    if not directory.is_dir():
        raise NotFoundError("is not a directory", path=str(directory))
    files, sizes = _list_files(directory)
    json_files = lazy_json_files(directory, tuple(n for n in JSON_FILES if n in files))
    candidates = {f: sizes[f] for f in files if f.endswith(".safetensors") and "/" not in f}

    def resolve() -> tuple[str, ...]:
        if INDEX in json_files:
            return shard_names_from_index(json_files[INDEX], source=str(directory / INDEX))
        if SINGLE_FILE in candidates:
            return (SINGLE_FILE,)
        # No index: every top-level safetensors file is a shard (some exports use another name).
        return tuple(sorted(candidates))

    headers = LocalHeaders(directory, candidates, resolve)
    # Scanning starts on the files present while a worker parses the index for the real shard list.
    plan = ScanPlan(early=candidates, header_bytes=int(sum(candidates.values()) * HEADER_TO_DATA_RATIO),
                    index_summarizer=partial(summarize_index_file, directory / INDEX) if INDEX in files else None)
    return RawCheckpoint(
        ref=ref, kind=kind, location=str(directory), files=tuple(sorted(files)), json_files=json_files,
        headers=headers, file_sizes=LocalSizes(headers), revision=revision, scan_plan=plan,
    )


def _list_files(directory: Path) -> tuple[set[str], dict[str, int]]:
    """Relative names (and sizes) of the files in the directory and one level of sub-folders."""
    found: set[str] = set()
    sizes: dict[str, int] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        raise SourceError(f"cannot list ({exc.strerror or exc})", path=str(directory)) from None
    for entry in entries:
        try:
            if entry.is_dir():
                for sub in os.scandir(entry.path):
                    if sub.is_file():
                        found.add(f"{entry.name}/{sub.name}")
                continue
            stat = os.stat(entry.path)  # follows symlinks (HF cache blobs); loops raise ELOOP
        except FileNotFoundError:
            continue  # dangling link: reported if an index names it
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SourceError("is a symlink loop", path=entry.path) from None
            raise SourceError(f"cannot read ({exc.strerror or exc})", path=entry.path) from None
        if stat.st_mode & 0o170000 == 0o100000:
            found.add(entry.name)
            sizes[entry.name] = stat.st_size
    return found, sizes
