"""Resolve what the user typed into a RawCheckpoint (or a RawGguf): the source registry.

Every kind of reference is one registered ``Source`` (sources/interface.py): a cheap ``claims(ref, path)``
and an ``open`` that does the I/O and returns a complete, eager record. ``open_source`` asks the kinds
added with ``register_source`` first (in registration order), then the built-in ones in ``BUILT_IN``'s
order, which is the whole dispatch rule (``open_source_async`` is the same for a caller with its own
event loop, the audit: the kinds that read the network await their reads there):

- ``gguf-local``  a ``.gguf`` file, a GGUF directory, ``dir:TAG``         (sources/gguf_local.py)
- ``local``       an existing directory                                   (sources/local.py)
- ``snapshot``    a ``*.json.gz`` / ``*.json`` file                       (sources/snapshot.py)
- ``gguf-hub``    a GGUF repo id: ``org/repo:TAG``, ``...GGUF``, or cached with GGUF files only;
                  read from the HF cache when it holds the model, else the Hub (sources/hub_gguf.py)
- ``hf-cache``    ``org/name[@revision]`` that the local Hugging Face cache holds completely
                  (sources/hf_cache.py); offline (HF_HUB_OFFLINE=1) a gap is an error naming it
- ``hub``         ``org/name[@revision]`` over HTTP ranges                (sources/hub.py)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ckptinspect.errors import NotFoundError
from ckptinspect.records import RawCheckpoint
from ckptinspect.sources.interface import Source
from ckptinspect.settings import DEFAULTS, Settings

if TYPE_CHECKING:
    from ckptinspect.sources.gguf_files import RawGguf
    from ckptinspect.sources.subfolders import SubfolderChooser

# Hub repo ids: "name" or "org/name", letters, digits, "-", "_", "."; optional "@revision".
_REPO_ID = re.compile(r"^(?:[\w.\-]+/)?[\w.\-]+(?:@[\w.\-/]+)?$")

__all__ = ["Source", "SourceKind", "BUILT_IN", "open_source", "open_source_async", "register_source", "source_kinds",
           "split_repo_ref"]


def split_repo_ref(ref: str) -> tuple[str, str | None]:
    """``org/name@rev`` -> (``org/name``, ``rev``)."""
    repo, _, revision = ref.partition("@")
    return repo, (revision or None)


@dataclass(frozen=True)
class SourceKind:
    """A ``Source`` made of two functions: ``claims(ref, path)`` says whether ``ref`` is one of it (cheap: a
    suffix, a magic number), ``open(ref, path, revision=, token=, progress=)`` reads it into a complete
    record (or None: not this kind after all, ask the next)."""

    name: str
    claims: Callable[[str, Path], bool]
    open: Callable[..., Any]
    # The coroutine form of ``open`` for a kind that reads the network (same arguments, plus ``limiter``
    # and ``ends_at``: sources/hub.py); None: ``open`` only reads files, and is called as it is.
    open_async: Callable[..., Any] | None = None
    # True: ``open`` also takes ``settings=`` (ckptinspect/settings.py: endpoint, limits, caches).
    takes_settings: bool = False
    # True: ``open`` (and ``open_async``) also take ``subfolders=``: which draft subfolders to read too
    # (sources/subfolders.py); a kind without it reads the checkpoint alone.
    takes_subfolders: bool = False


_REGISTERED: list[Source] = []


def register_source(kind: Source) -> None:
    """Add ``kind`` to the kinds ``open_source`` asks before the built-in ones, in registration order
    (once per name)."""
    if all(k.name != kind.name for k in _REGISTERED):
        _REGISTERED.append(kind)


def open_source(ref: str, *, revision: str | None = None, token: str | None = None,
                progress: bool = True, settings: Settings | None = None,
                subfolders: "SubfolderChooser | None" = None) -> "RawCheckpoint | RawGguf":
    """Open a model reference: the first kind that claims ``ref`` and opens it (``source_kinds()``);
    ``settings``: handed to a kind that reads the network or a cache (``takes_settings``); ``subfolders``:
    the draft subfolders to read too (sources/subfolders.py), handed to a kind that ``takes_subfolders``.

    Raises:
        NotFoundError: nothing matches the reference.
        SourceError / ConfigError / HeaderError / NetworkError / AccessError: see the individual sources.
    """
    path = Path(ref).expanduser()
    for kind in source_kinds():
        if kind.claims(ref, path):
            extra = _extra(kind, settings, subfolders)
            opened = kind.open(ref, path, revision=revision, token=token, progress=progress, **extra)
            if opened is not None:
                return opened
    if path.exists():
        raise NotFoundError("is neither a model directory nor a .json.gz snapshot", path=ref)
    raise NotFoundError("no such directory, and not a Hub repo id (org/name[@revision])", path=ref)


def _extra(kind: Any, settings: Settings | None, subfolders: "SubfolderChooser | None") -> dict[str, Any]:
    extra: dict[str, Any] = {"settings": settings} if getattr(kind, "takes_settings", False) else {}
    if subfolders is not None and getattr(kind, "takes_subfolders", False):
        extra["subfolders"] = subfolders
    return extra


async def open_source_async(ref: str, *, revision: str | None = None, token: str | None = None,
                            progress: bool = False, limiter: Any = None, ends_at: float | None = None,
                            hub_only: bool = False, settings: Settings | None = None,
                            subfolders: "SubfolderChooser | None" = None) -> "RawCheckpoint | RawGguf":
    """``open_source`` for a caller on an event loop: the Hub kinds' reads are awaited on it, under
    ``limiter`` (an ``asyncio.Semaphore`` bounding requests in flight) and ``ends_at`` (a deadline).
    ``hub_only``: ``ref`` is a Hub repo id (one a listing named), never a local path, whatever the
    current directory holds: only the kinds in ``HUB_KINDS`` are asked, as if no such path existed."""
    path = Path(ref).expanduser() if not hub_only else Path("/dev/null") / ref  # the latter never exists
    for kind in source_kinds():
        if hub_only and kind.name not in HUB_KINDS:
            continue
        if kind.claims(ref, path):
            opener = getattr(kind, "open_async", None)
            if opener is not None:
                sub = {"subfolders": subfolders} if subfolders is not None and getattr(
                    kind, "takes_subfolders", False) else {}
                opened = await opener(ref, path, revision=revision, token=token, progress=progress,
                                      limiter=limiter, ends_at=ends_at, hub_only=hub_only, settings=settings, **sub)
            else:
                extra = _extra(kind, settings, subfolders)
                opened = kind.open(ref, path, revision=revision, token=token, progress=progress, **extra)
            if opened is not None:
                return opened
    if path.exists():
        raise NotFoundError("is neither a model directory nor a .json.gz snapshot", path=ref)
    raise NotFoundError("no such directory, and not a Hub repo id (org/name[@revision])", path=ref)


def source_kinds() -> tuple[Source, ...]:
    """Every kind ``open_source`` asks, in order: the registered ones, then ``BUILT_IN``."""
    return (*_REGISTERED, *BUILT_IN)


# -- the built-in kinds --------------------------------------------------------------------------------
def _open_gguf(ref: str, path: Path, *, revision: str | None, token: str | None, progress: bool,
               settings: Settings | None = None) -> "RawGguf | None":
    from ckptinspect.sources.gguf_local import GgufHubRead, open_gguf_if_gguf

    found = open_gguf_if_gguf(ref, revision=revision, token=token)
    if not isinstance(found, GgufHubRead):
        return found
    from ckptinspect.sources.hub_gguf import open_gguf_hub

    return open_gguf_hub(found.repo_id, ref=found.ref, tag=found.tag, revision=found.revision, token=token,
                         settings=settings or DEFAULTS)


async def _open_gguf_async(ref: str, path: Path, *, revision: str | None, token: str | None, progress: bool,
                           limiter: Any = None, ends_at: float | None = None,
                           hub_only: bool = False, settings: Settings | None = None) -> "RawGguf | None":
    from ckptinspect.sources.gguf_local import GgufHubRead, open_gguf_if_gguf

    found = open_gguf_if_gguf(ref, revision=revision, token=token, local=not hub_only)
    if not isinstance(found, GgufHubRead):
        return found
    from ckptinspect.sources.hub_gguf import read_gguf_hub

    return await read_gguf_hub(found.repo_id, ref=found.ref, tag=found.tag, revision=found.revision, token=token,
                               limiter=limiter, ends_at=ends_at, settings=settings or DEFAULTS)


def _claims_local_gguf(ref: str, path: Path) -> bool:
    from ckptinspect.sources.gguf_local import claims_local_gguf

    return claims_local_gguf(ref, path)


def _claims_gguf_repo(ref: str, path: Path) -> bool:
    from ckptinspect.sources.gguf_local import claims_gguf_repo

    return claims_gguf_repo(ref, path)


def _open_local(ref: str, path: Path, *, revision: str | None, token: str | None, progress: bool,
                subfolders: "SubfolderChooser | None" = None) -> RawCheckpoint:
    from ckptinspect.sources.local import open_local

    return open_local(path, ref=ref, subfolders=subfolders)


def _claims_snapshot(ref: str, path: Path) -> bool:
    return ref.endswith((".json.gz", ".json")) and not path.is_dir()


def _open_snapshot(ref: str, path: Path, *, revision: str | None, token: str | None,
                   progress: bool) -> RawCheckpoint:
    if not path.exists():
        raise NotFoundError("snapshot file does not exist", path=ref)
    from ckptinspect.sources.snapshot import read_snapshot

    return read_snapshot(path)


def _claims_repo_id(ref: str, path: Path) -> bool:
    return not path.exists() and bool(_REPO_ID.match(ref)) and not ref.startswith((".", "/", "~"))


def _repo_and_revision(ref: str, revision: str | None) -> tuple[str, str | None]:
    repo_id, ref_revision = split_repo_ref(ref)
    revision = revision or ref_revision
    if revision is not None:  # before it is joined into a cache path or a URL
        from ckptinspect.sources.revisions import check_revision

        check_revision(revision)
    return repo_id, revision


def _open_hf_cache(ref: str, path: Path, *, revision: str | None, token: str | None,
                   progress: bool, subfolders: "SubfolderChooser | None" = None) -> RawCheckpoint | None:
    from ckptinspect.sources.hf_cache import open_hf_cache

    repo_id, revision = _repo_and_revision(ref, revision)
    return open_hf_cache(repo_id, revision=revision, subfolders=subfolders)  # None: not (fully) cached, ask the Hub


def _open_hub(ref: str, path: Path, *, revision: str | None, token: str | None, progress: bool,
              settings: Settings | None = None, subfolders: "SubfolderChooser | None" = None) -> RawCheckpoint:
    from ckptinspect.sources.hub import open_hub

    repo_id, revision = _repo_and_revision(ref, revision)
    return open_hub(repo_id, revision=revision, token=token, progress=progress, settings=settings,
                    subfolders=subfolders)


async def _open_hub_async(ref: str, path: Path, *, revision: str | None, token: str | None, progress: bool,
                          limiter: Any = None, ends_at: float | None = None, hub_only: bool = False,
                          settings: Settings | None = None,
                          subfolders: "SubfolderChooser | None" = None) -> RawCheckpoint:
    from ckptinspect.sources.hub import read_hub

    repo_id, revision = _repo_and_revision(ref, revision)
    return await read_hub(repo_id, revision=revision, token=token, progress=progress, limiter=limiter,
                          ends_at=ends_at, settings=settings, subfolders=subfolders)


HUB_KINDS = ("gguf-hub", "hf-cache", "hub")  # the kinds that read a repo id, from the HF cache or the Hub
BUILT_IN: tuple[Source, ...] = (
    SourceKind("gguf-local", _claims_local_gguf, _open_gguf, open_async=_open_gguf_async, takes_settings=True),
    SourceKind("local", lambda ref, path: path.is_dir(), _open_local, takes_subfolders=True),
    SourceKind("snapshot", _claims_snapshot, _open_snapshot),
    SourceKind("gguf-hub", _claims_gguf_repo, _open_gguf, open_async=_open_gguf_async, takes_settings=True),
    SourceKind("hf-cache", _claims_repo_id, _open_hf_cache, takes_subfolders=True),
    SourceKind("hub", _claims_repo_id, _open_hub, open_async=_open_hub_async, takes_settings=True,
               takes_subfolders=True),
)
