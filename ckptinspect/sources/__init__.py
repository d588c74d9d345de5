"""Resolve what the user typed into a RawCheckpoint.

- an existing directory                -> local (sources/local.py)
- a ``*.json.gz`` file                 -> a metadata snapshot (sources/snapshot.py)
- a GGUF file / directory / repo       -> sources/gguf_local.py, gguf_hub.py (a RawGguf, not a RawCheckpoint)
- ``org/name[@revision]``              -> the local Hugging Face cache when it holds the whole
                                          checkpoint (sources/hf_cache.py), else the Hub over HTTP
                                          ranges (sources/hub.py); ``HF_HUB_OFFLINE=1`` forbids the Hub.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

from ckptinspect.errors import NotFoundError
from ckptinspect.records import RawCheckpoint
from ckptinspect.sources.offline import hub_offline

# Hub repo ids: "name" or "org/name", letters, digits, "-", "_", "."; optional "@revision".
_REPO_ID = re.compile(r"^(?:[\w.\-]+/)?[\w.\-]+(?:@[\w.\-/]+)?$")


def split_repo_ref(ref: str) -> tuple[str, str | None]:
    """``org/name@rev`` -> (``org/name``, ``rev``)."""
    repo, _, revision = ref.partition("@")
    return repo, (revision or None)


@dataclass(frozen=True)
class SourceKind:
    """A kind of checkpoint reference beyond the built-in ones (e.g. a file format): ``claims(ref, path)``
    says whether ``ref`` is one of it (cheap: a suffix, a magic number), ``open(ref, path, revision=,
    token=, progress=)`` reads it into a complete RawCheckpoint."""

    name: str
    claims: Callable[[str, Path], bool]
    open: Callable[..., RawCheckpoint]


_REGISTERED: list[SourceKind] = []


def register_source(kind: SourceKind) -> None:
    """Add ``kind`` to the kinds ``open_source`` asks first, in registration order (once per name)."""
    if all(k.name != kind.name for k in _REGISTERED):
        _REGISTERED.append(kind)


def open_source(ref: str, *, revision: str | None = None, token: str | None = None,
                progress: bool = True, scan: Callable[[str, bytes, int | None], Any] | None = None) -> RawCheckpoint:
    """Open a model reference (directory, snapshot file, or Hub repo id).

    ``scan``, when given, is a per-shard header scan the Hub source runs on each header as it arrives
    (RawCheckpoint.scan_plan.scanned); the report does not pass it (see pipeline.py), the other sources
    ignore it.

    Raises:
        NotFoundError: nothing matches the reference.
        SourceError / ConfigError / HeaderError: see the individual sources.
    """
    from ckptinspect.sources.gguf_local import open_gguf_if_gguf

    gguf = open_gguf_if_gguf(ref, revision=revision, token=token)  # None unless ref names a GGUF model
    if gguf is not None:
        return gguf
    path = Path(ref).expanduser()
    for kind in _REGISTERED:
        if kind.claims(ref, path):
            return kind.open(ref, path, revision=revision, token=token, progress=progress)
    if path.is_dir():
        from ckptinspect.sources.local import open_local

        return open_local(path, ref=ref)
    if ref.endswith(".json.gz") or ref.endswith(".json"):
        if not path.exists():
            raise NotFoundError("snapshot file does not exist", path=ref)
        from ckptinspect.sources.snapshot import read_snapshot

        return read_snapshot(path)
    if path.exists():
        raise NotFoundError("is neither a model directory nor a .json.gz snapshot", path=ref)
    if not _REPO_ID.match(ref) or ref.startswith((".", "/", "~")):
        raise NotFoundError("no such directory, and not a Hub repo id (org/name[@revision])", path=ref)

    repo_id, ref_revision = split_repo_ref(ref)
    revision = revision or ref_revision
    if revision is not None:  # before it is joined into a cache path or a URL
        from ckptinspect.sources.revisions import check_revision

        check_revision(revision)
    from ckptinspect.sources.hf_cache import open_hf_cache

    cached = open_hf_cache(repo_id, revision=revision)
    if cached is not None:
        return cached
    if hub_offline():
        raise NotFoundError("HF_HUB_OFFLINE=1 and the checkpoint is not (fully) in the local Hugging Face cache",
                            path=ref)
    from ckptinspect.sources.hub import open_hub

    return open_hub(repo_id, revision=revision, token=token, progress=progress, scan=scan)
