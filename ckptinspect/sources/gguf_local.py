"""GGUF models on disk: one file, a split set, a directory of quants, or a repo in the HF cache.

Headers are read with bounded ``pread`` calls, extended on demand up to the end of the tensor infos
(header/gguf.py asks for the header's bytes only, never tensor data). Not a memory map: a file that
shrinks while it is mapped (a download being replaced, a truncating writer) kills the process with
SIGBUS on the next touched page, and no exception handler can turn that into an error line; a short
``pread`` is a truncated header, one error line. ``claims_local_gguf`` / ``claims_gguf_repo`` are the GGUF kinds' claims in the
source registry (sources/__init__.py); ``open_gguf_if_gguf`` opens what they claim.

A reference is GGUF when it is a ``.gguf`` file, a directory holding GGUF files and no safetensors
weights, or a repo id that is either tagged (llama.cpp's ``org/repo:TAG``), named ``...GGUF`` (the
Hub's convention for GGUF repos), or cached locally with GGUF files only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.errors import NotFoundError, SourceError
from ckptinspect.header.gguf import ByteWindow, GgufHeader, parse_gguf
from ckptinspect.sources.gguf_files import (TAGGED_REF, RawGguf, check_split, companions_for, is_gguf,
                                            model_sets, select_set, set_name)
from ckptinspect.sources.interface import open_regular

MAX_LISTED_FILES = 100_000  # a directory walk stops here (a model directory holds tens of files)


def read_gguf_header(path: Path, *, source: str) -> GgufHeader:
    """Parse one local GGUF file's header (regular files only; one-line errors naming ``source``)."""
    fd, size = open_regular(path, source=source, what="GGUF file")
    try:
        def extend(start: int, stop: int) -> bytes:
            return _pread_range(fd, start, stop, source)

        first = _pread_range(fd, 0, min(size, FIRST_READ_BYTES), source)
        return parse_gguf(ByteWindow(first, source=source, file_size=size, extend=extend))
    finally:
        os.close(fd)


FIRST_READ_BYTES = 1 << 20  # most headers without a vocabulary fit; a vocabulary extends it in a few reads
_PREAD_CHUNK = 16 << 20


def _pread_range(fd: int, start: int, stop: int, source: str) -> bytes:
    """Bytes [start, stop) of the file, fewer when it ends (or shrank) before ``stop``."""
    parts = []
    pos = start
    while pos < stop:
        try:
            piece = os.pread(fd, min(stop - pos, _PREAD_CHUNK), pos)
        except OSError as exc:
            raise SourceError(f"cannot read the GGUF file ({exc.strerror or exc})", path=source) from None
        if not piece:
            break
        parts.append(piece)
        pos += len(piece)
    return b"".join(parts)


def list_gguf_dir(directory: Path) -> list[str]:
    """Relative names of the files in ``directory`` and one level of folders below (quant folders)."""
    names: list[str] = []
    for entry in sorted(directory.iterdir()):
        if entry.is_file():
            names.append(entry.name)
        elif entry.is_dir() and not entry.name.startswith("."):
            names.extend(f"{entry.name}/{sub.name}" for sub in sorted(entry.iterdir()) if sub.is_file())
        if len(names) > MAX_LISTED_FILES:
            raise SourceError(f"holds over {MAX_LISTED_FILES:,} files", path=str(directory))
    return names


def open_gguf_dir(directory: Path, *, ref: str, tag: str | None = None, kind: str = "local",
                  only: str | None = None, revision: str | None = None) -> RawGguf:
    """The GGUF model in ``directory`` (``only``: the file the user named, with its split siblings)."""
    names = list_gguf_dir(directory)
    if only is not None:  # the file the user named, with its split siblings
        chosen = set_name(only)
        files = [n for n in names if is_gguf(n) and set_name(n) == chosen]
        sets = tuple(model_sets(names)) or (chosen,)
    else:
        chosen, files, sets = select_set(names, tag, where=str(directory))
    parts = [(name, read_gguf_header(directory / name, source=str(directory / name))) for name in files]
    check_split(parts, where=str(directory / chosen))
    heads = [(name, read_gguf_header(directory / name, source=str(directory / name)))
             for name in companions_for(names, chosen)]
    return RawGguf(ref=ref, kind=kind, location=str(directory), files=tuple(names), model=chosen,
                   parts=tuple(parts), companions=tuple(heads), model_sets=sets, revision=revision,
                   stats={"files_read": len(parts) + len(heads)})


def open_gguf_if_gguf(ref: str, *, revision: str | None = None, token: str | None = None,
                      local: bool = True) -> Any:
    """A RawGguf when ``ref`` names a local or cached GGUF model, a ``GgufHubRead`` when it names a GGUF
    repo to read from the Hub, else None (the caller tries the other sources). ``local=False``: ``ref``
    is a repo id whatever the current directory holds (an id a Hub listing named)."""
    path = Path(ref).expanduser() if local else Path("/dev/null") / ref  # the latter never exists
    if path.is_file() and is_gguf(path.name):
        return open_gguf_dir(path.parent, ref=ref, only=path.name)
    if path.is_dir():
        if _is_gguf_dir(path):
            return open_gguf_dir(path, ref=ref)
        return None
    base, sep, tag = ref.rpartition(":")
    if local and sep and "/" not in tag and Path(base).expanduser().is_dir() and _is_gguf_dir(Path(base).expanduser()):
        return open_gguf_dir(Path(base).expanduser(), ref=ref, tag=tag)
    if path.exists():
        return None
    if is_gguf(ref):  # a file path that is not there, not a repo id
        raise NotFoundError("no such GGUF file", path=ref)
    m = TAGGED_REF.match(ref)
    if m is None or ref.startswith((".", "/", "~")):
        return None
    repo_id, tag, rev = m.group("repo"), m.group("tag"), revision or m.group("rev")
    from ckptinspect.sources.offline import hub_offline

    cached = _cached_snapshot(repo_id, rev)
    if cached is not None and _is_gguf_dir(cached):
        try:
            return open_gguf_dir(cached, ref=ref, tag=tag, kind="hf-cache", revision=rev)
        except NotFoundError:
            if hub_offline():
                raise
            # the cache holds another quant or part of a split set: read the headers from the Hub
    elif tag is None and not repo_id.lower().endswith("gguf"):
        return None
    if hub_offline():
        raise NotFoundError("HF_HUB_OFFLINE=1 and the GGUF repo is not in the local Hugging Face cache", path=ref)
    return GgufHubRead(repo_id=repo_id, ref=ref, tag=tag, revision=rev)


@dataclass(frozen=True)
class GgufHubRead:
    """What ``open_gguf_if_gguf`` answers for a GGUF repo the HF cache cannot answer: the Hub read to make
    (sources/hub_gguf.py; the registry makes it, from synchronous or asynchronous code)."""

    repo_id: str
    ref: str
    tag: str | None
    revision: str | None


def claims_local_gguf(ref: str, path: Path) -> bool:
    """A GGUF file, a GGUF directory (``dir`` or ``dir:TAG``), or a ``.gguf`` path that is not there (the
    open then says so) — the cheap checks ``open_gguf_if_gguf`` makes first (registry: sources/__init__.py)."""
    if path.is_file():
        return is_gguf(path.name)
    if path.is_dir():
        return _is_gguf_dir(path)
    base, sep, tag = ref.rpartition(":")
    if sep and "/" not in tag and Path(base).expanduser().is_dir() and _is_gguf_dir(Path(base).expanduser()):
        return True
    return not path.exists() and is_gguf(ref)


def claims_gguf_repo(ref: str, path: Path) -> bool:
    """A repo id that names a GGUF model: tagged (``org/repo:TAG``), named ``...GGUF``, or cached with GGUF
    files only (one ref file and one listing read)."""
    m = TAGGED_REF.match(ref)
    if m is None or ref.startswith((".", "/", "~")) or path.exists() or is_gguf(ref):
        return False
    if m.group("tag") is not None or m.group("repo").lower().endswith("gguf"):
        return True
    cached = _cached_snapshot(m.group("repo"), m.group("rev"))
    return cached is not None and _is_gguf_dir(cached)


def looks_like_gguf(ref: str) -> bool:
    """A local GGUF file or directory (no network: for commands that refuse GGUF before reading it)."""
    path = Path(ref.rpartition(":")[0] if ":" in ref and not Path(ref).exists() else ref).expanduser()
    return (path.is_file() and is_gguf(path.name)) or (path.is_dir() and _is_gguf_dir(path))


def _is_gguf_dir(directory: Path) -> bool:
    """GGUF files present and no safetensors weights (a safetensors checkpoint with a GGUF copy stays safetensors)."""
    try:
        names = list_gguf_dir(directory)
    except OSError:
        return False
    return any(is_gguf(n) for n in names) and not any(n.endswith(".safetensors") for n in names)


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    from ckptinspect.sources.hf_cache import repo_storage, resolve_commit

    commit = resolve_commit(repo_id, revision)
    if commit is None:
        return None
    snapshot = repo_storage(repo_id) / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None
