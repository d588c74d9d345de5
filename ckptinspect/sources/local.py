"""A model directory on disk (also the snapshot folders of the Hugging Face cache).

Only config / quantization / index JSON files and each shard's header bytes are read; tensor data,
and anything that deserializes through pickle, is never opened. Nothing is written.

The record is eager: every JSON file is parsed, the index summarized (header/index.py) and every shard's
header read before ``open_local`` returns, so the report's later stages never touch the disk and read a
local checkpoint exactly as they read one from the Hub or a snapshot.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ckptinspect.errors import NotFoundError, SourceError
from ckptinspect.header.index import index_name, is_mistral_format, is_mistral_shard, summarize_index
from ckptinspect.records import IndexSummary, RawCheckpoint
from ckptinspect.sources import interface
from ckptinspect.sources.subfolders import SubfolderChooser, chosen
from ckptinspect.sources.interface import (
    CONFIG, JSON_FILES, SINGLE_FILE, is_index_file, parse_json_bytes, read_file_bytes, read_header_file,
)


@dataclass(frozen=True)
class Listing:
    """What a directory holds: relative names (one level of sub-folders), and the size of each top-level
    regular file (symlinks followed, as the HF cache's snapshot links to its blobs)."""

    files: frozenset[str]
    sizes: dict[str, int]


@dataclass(frozen=True)
class Metadata:
    """A directory's JSON files, parsed, and what its index says (None without an index)."""

    json_files: dict[str, Any]
    summary: IndexSummary | None


def open_local(directory: Path, *, ref: str | None = None, kind: str = "local",
               revision: str | None = None, subfolders: SubfolderChooser | None = None) -> RawCheckpoint:
    """Read a checkpoint directory's metadata, all of it, now; ``subfolders``: which draft subfolders to read
    too, from the config (sources/subfolders.py), each as a directory of its own.

    Raises:
        NotFoundError: the directory, or a shard named by the index, is missing.
        SourceError: unreadable files or symlink loops.
        ConfigError: malformed JSON metadata.  HeaderError: a malformed shard header prefix.
    """
    if not directory.is_dir():
        raise NotFoundError("is not a directory", path=str(directory))
    listing = list_directory(directory)
    metadata = read_metadata(directory, listing)
    raw = read_checkpoint(directory, listing, metadata, ref=ref or str(directory), kind=kind, revision=revision)
    return with_subfolders(raw, directory, listing, metadata, subfolders, kind=kind)


def with_subfolders(raw: RawCheckpoint, directory: Path, listing: Listing, metadata: Metadata,
                    chooser: SubfolderChooser | None, *, kind: str) -> RawCheckpoint:
    """``raw`` with the draft subfolders ``chooser`` names read from ``directory`` (each one's JSON files and
    shard headers, by the same guarded readers; a missing shard is the NotFoundError of any checkpoint)."""
    names = chosen(chooser, metadata.json_files.get(CONFIG), listing.files)
    if not names:
        return raw
    subs = {}
    for name in names:
        sub = directory / name
        sub_listing = list_directory(sub)
        subs[name] = read_checkpoint(sub, sub_listing, read_metadata(sub, sub_listing), ref=f"{raw.ref}/{name}",
                                     kind=kind, revision=raw.revision)
    return replace(raw, subfolders=subs)


def read_metadata(directory: Path, listing: Listing) -> Metadata:
    """Parse the JSON files present; summarize the index (its one parse and one summary per report): Mistral's
    consolidated.safetensors.index.json in that format (header/index.py is_mistral_format), else the Hugging
    Face one."""
    json_files = {name: parse_json_bytes(read_file_bytes(directory / name), source=str(directory / name),
                                         files=listing.files if is_index_file(name) else None)
                  for name in JSON_FILES if name in listing.sizes}
    index = index_name(listing.files)
    summary = summarize_index(json_files[index], source=str(directory / index)) if index in json_files else None
    return Metadata(json_files, summary)


def shard_names(listing: Listing, metadata: Metadata) -> tuple[str, ...]:
    """The shards engines load: the index's, else (Mistral's format) every top-level consolidated*.safetensors
    file, else ``model.safetensors``, else every top-level safetensors file (some exports use another name)."""
    if metadata.summary is not None:
        return metadata.summary.shards
    if is_mistral_format(listing.files):
        return tuple(sorted(f for f in listing.sizes if is_mistral_shard(f)))
    if SINGLE_FILE in listing.sizes:
        return (SINGLE_FILE,)
    return tuple(sorted(f for f in listing.sizes if f.endswith(".safetensors")))


def read_checkpoint(directory: Path, listing: Listing, metadata: Metadata, *, ref: str, kind: str,
                    revision: str | None) -> RawCheckpoint:
    """Read every shard's header (the prefix and N bytes, nothing more) into the record."""
    headers: dict[str, bytes] = {}
    sizes: dict[str, int | None] = {}
    left = interface.MAX_TOTAL_HEADER_BYTES
    for shard in shard_names(listing, metadata):
        if shard not in listing.files and not os.path.lexists(directory / shard):
            raise NotFoundError(f"shard '{shard}' named by the index is missing", path=str(directory))
        headers[shard], sizes[shard] = read_header_file(directory / shard, source=shard, left=left)
        left -= len(headers[shard])
    return RawCheckpoint(
        ref=ref, kind=kind, location=str(directory), files=tuple(sorted(listing.files)),
        json_files=metadata.json_files, headers=headers, file_sizes=sizes, revision=revision,
        index_summary=metadata.summary,
    )


def list_directory(directory: Path) -> Listing:
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
    return Listing(frozenset(found), sizes)
