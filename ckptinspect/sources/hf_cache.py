"""A repo id answered from the local Hugging Face cache, without any network access.

Cache layout (huggingface_hub ``file_download.py``, documented in ``hf_api.py`` ``scan_cache_dir``)::

    $HF_HUB_CACHE/models--{org}--{name}/
        blobs/{etag}                        file contents (git blob sha1, or sha256 for LFS files)
        refs/{branch or tag}                the commit hash that revision pointed to
        snapshots/{commit}/{file}           relative symlink -> ../../blobs/{etag}

The cache directory is huggingface_hub's own (``constants.HF_HUB_CACHE``: HF_HUB_CACHE, else HF_HOME/hub,
else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub, as huggingface_hub read them), the
directory ``hf_hub_download`` writes; this tool reads no environment below its edge (ckptinspect/settings.py). A repo counts as cached when its snapshot holds config.json and every shard
(all ``weight_map`` values of the index, or ``model.safetensors``); headers are then read from those files. In
Mistral's format (header/index.py is_mistral_format) params.json stands for config.json and the shards are the
consolidated ones (consolidated.safetensors.index.json's, else every consolidated*.safetensors file).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Callable

from ckptinspect.errors import NotFoundError, SourceError
from ckptinspect.header.index import MISTRAL_INDEX, PARAMS, is_mistral_format, is_mistral_shard
from ckptinspect.records import RawCheckpoint
from ckptinspect.sources.offline import hub_offline
from ckptinspect.sources.revisions import check_revision
from ckptinspect.sources.subfolders import SubfolderChooser, chosen

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_COMMIT = re.compile(r"[0-9a-f]{40}")
# Blob names huggingface_hub uses: a git blob sha1 or an LFS sha256. The etag comes from the server (repo
# info, X-Linked-Etag): anything else could name a path outside the cache, so it is not stored.
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_LOCK_WAIT_S = 10.0  # another process writing the same blob: wait this long, then skip caching


def hub_cache_dir() -> Path:
    """The HF hub cache directory: huggingface_hub's ``constants.HF_HUB_CACHE`` (which a program can set,
    as ``hf_hub_download`` follows it too)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def repo_storage(repo_id: str) -> Path:
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def resolve_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit a revision points to in the cache (a 40-hex revision is itself), None if unknown.

    The revision must be valid (sources/revisions.py): it is joined under ``refs/``. The ref file is read
    as a regular file of at most a few bytes (it holds one commit hash), never a FIFO or a device."""
    rev = revision or "main"
    if _COMMIT.fullmatch(rev):
        return rev
    check_revision(rev)
    ref = repo_storage(repo_id) / "refs" / rev
    if not os.path.lexists(ref):
        return None
    from ckptinspect.guarded_file import MAX_REF_BYTES, read_text

    # A ref is a small regular file; a FIFO, a device or a huge file there is one error line, not a hang.
    commit = read_text(ref, what="HF cache ref", cap=MAX_REF_BYTES, error=SourceError).strip()
    return commit if _COMMIT.fullmatch(commit) else None


def cached_file(repo_id: str, commit: str, filename: str) -> Path | None:
    """The cached copy of ``filename`` at ``commit`` (huggingface_hub's ``try_to_load_from_cache``), or None."""
    from huggingface_hub import try_to_load_from_cache

    if not _COMMIT.fullmatch(commit):
        return None
    try:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir(), revision=commit)
    except (ValueError, OSError):
        return None
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def cache_store(repo_id: str, commit: str, revision: str | None, filename: str, data: bytes,
                etag: str | None) -> None:
    """Put ``data`` into the cache as huggingface_hub does (blob + relative symlink + ref).

    As huggingface_hub's ``hf_hub_download``: under its per-blob lock (``.locks/models--org--name/<etag>.lock``,
    ``WeakFileLock``), written to a temporary ``.incomplete`` file created with mode 0666 less the umask
    (0664 under the usual umask, so a shared HF_HOME works for another user), then renamed into place.
    The temporary file is removed on every failure path (a full disk, Ctrl-C, SIGTERM as SystemExit).

    Best effort: a read-only or full cache never fails the command. Without an etag (blob id) the file
    is not cached, since the blob name must be the one huggingface_hub would use.
    """
    if not etag or not _ETAG.fullmatch(etag) or not _COMMIT.fullmatch(commit) or not _safe_ref(revision):
        return
    from huggingface_hub.utils import WeakFileLock

    storage = repo_storage(repo_id)
    blob = storage / "blobs" / etag
    try:
        lock = hub_cache_dir() / ".locks" / storage.name / f"{etag}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock, timeout=_LOCK_WAIT_S):
            if not blob.exists():
                blob.parent.mkdir(parents=True, exist_ok=True)
                _write_new(blob, data)
            pointer = storage / "snapshots" / commit / filename
            pointer.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(pointer):
                try:
                    pointer.symlink_to(os.path.relpath(blob, pointer.parent))
                except OSError:  # no symlinks (some Windows setups): huggingface_hub copies too
                    _write_new(pointer, data)
        if revision and revision != commit:
            ref = storage / "refs" / revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            _write_new(ref, commit.encode())
    except Exception:  # noqa: BLE001 - OSError, a lock timeout: the cache is an optimisation only
        return


def _write_new(target: Path, data: bytes) -> None:
    """Write ``target`` atomically through ``<target>.<random>.incomplete``, removed on any failure."""
    tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex[:12]}.incomplete")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with open(fd, "wb", closefd=True) as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _safe_ref(revision: str | None) -> bool:
    """A branch / tag name usable as a path under refs/ (``refs/pr/1`` is; ``..``, absolute paths are not)."""
    if not revision:
        return True
    parts = revision.split("/")
    return not revision.startswith(("/", "\\")) and all(p not in ("", ".", "..") and "\\" not in p for p in parts)


def _mistral_snapshot(snapshot: Path) -> bool:
    """The snapshot is in Mistral's format (params.json + consolidated*.safetensors: header/index.py)."""
    try:
        return is_mistral_format(os.listdir(snapshot))
    except OSError:
        return False


def _config_name(snapshot: Path) -> str:
    """The config file a cached snapshot needs: params.json in Mistral's format, else config.json."""
    return PARAMS if _mistral_snapshot(snapshot) else "config.json"


def _shards_wanted(snapshot: Path) -> tuple[list[str] | None, str | None]:
    """Shard names the snapshot must hold; (None, reason) when that cannot be known from the cache."""
    mistral = _mistral_snapshot(snapshot)
    index_path = snapshot / (MISTRAL_INDEX if mistral else INDEX_FILE)
    if mistral and not index_path.is_file():  # the consolidated files themselves, as vLLM globs them
        return sorted(n for n in os.listdir(snapshot) if is_mistral_shard(n)), None
    if index_path.is_file():
        # The same decoder and checks as every other index (depth, huge integers, non-name values).
        from ckptinspect.sources.interface import parse_json_bytes, read_file_bytes, shard_names_from_index

        index = parse_json_bytes(read_file_bytes(index_path), source=str(index_path))
        return sorted(shard_names_from_index(index, source=str(index_path))), None
    if (snapshot / SINGLE_FILE).exists() or os.path.lexists(snapshot / SINGLE_FILE):
        return [SINGLE_FILE], None
    return None, f"{INDEX_FILE} (or {SINGLE_FILE})"


def describe_cache_gap(repo_id: str, revision: str | None = None) -> str:
    """One phrase naming what the cache lacks for ``repo_id@revision`` ("" when nothing is missing)."""
    rev = revision or "main"
    storage = repo_storage(repo_id)
    if not storage.is_dir():
        return f"{repo_id} is not in the HF cache at {hub_cache_dir()}"
    commit = resolve_commit(repo_id, revision)
    if commit is None:
        return f"revision {rev!r} of {repo_id} is not in the HF cache ({storage}/refs/{rev} missing)"
    snapshot = storage / "snapshots" / commit
    config = _config_name(snapshot)
    missing = [] if (snapshot / config).is_file() else [config]
    shards, reason = _shards_wanted(snapshot)
    if reason:
        missing.append(reason)
    missing += [s for s in shards or [] if not (snapshot / s).is_file()]
    if not missing:
        return ""
    head = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"{repo_id}@{commit[:12]} in the HF cache lacks {head}"


def open_hf_cache(repo_id: str, *, revision: str | None = None, required: bool | None = None,
                  subfolders: SubfolderChooser | None = None) -> RawCheckpoint | None:
    """Read ``repo_id@revision`` from the HF cache; None when not fully cached.

    The snapshot folder is read once, eagerly (sources/local.py): its index parsed and summarized once,
    and the shards it names checked against what the folder holds before any header is read. A folder
    that holds no safetensors file at all (a Hub run caches only the JSON files) is answered without
    parsing its index.

    Args:
        required: raise NotFoundError naming what is missing instead of returning None. Defaults to
            huggingface_hub's offline mode (HF_HUB_OFFLINE=1): offline, the caller cannot fall back to
            the Hub, so the error says which file the cache lacks.
    """
    if required is None:
        required = hub_offline()

    def gap(what: Callable[[], str]) -> None:  # the message is made only when it is raised
        if required:
            raise NotFoundError(f"HF_HUB_OFFLINE=1 and {what()}", path=repo_id,
                                hint="run once online, or use a .json.gz snapshot")
        return None

    storage = repo_storage(repo_id)
    if not storage.is_dir():
        return gap(lambda: f"{repo_id} is not in the HF cache at {hub_cache_dir()}")
    commit = resolve_commit(repo_id, revision)
    snapshot = storage / "snapshots" / commit if commit is not None else None
    if snapshot is None or not snapshot.is_dir() or not (snapshot / _config_name(snapshot)).is_file():
        return gap(lambda: describe_cache_gap(repo_id, revision) or f"{repo_id} is not in the HF cache")
    from ckptinspect.sources.local import list_directory, read_checkpoint, read_metadata, shard_names, with_subfolders

    listing = list_directory(snapshot)
    if not any(name.endswith(".safetensors") for name in listing.files) and not required:
        return None  # nothing to read headers from: no need to parse a 41 MB index to learn it
    if not (INDEX_FILE in listing.sizes or SINGLE_FILE in listing.sizes or is_mistral_format(listing.files)):
        return gap(lambda: f"{repo_id}@{commit[:12]} in the HF cache lacks {INDEX_FILE} (or {SINGLE_FILE})")
    metadata = read_metadata(snapshot, listing)
    missing = [s for s in shard_names(listing, metadata) if s not in listing.files]
    if missing:
        head = ", ".join(sorted(missing)[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return gap(lambda: f"{repo_id}@{commit[:12]} in the HF cache lacks {head}")
    ref = repo_id if revision is None else f"{repo_id}@{revision}"
    raw = read_checkpoint(snapshot, listing, metadata, ref=ref, kind="hf-cache", revision=commit)
    # a draft subfolder the family declares: read from the snapshot when it is cached there completely;
    # one whose shards the cache lacks is a gap like any other (the Hub is asked)
    for name in chosen(subfolders, metadata.json_files.get("config.json"), listing.files):
        sub_listing = list_directory(snapshot / name)
        sub_missing = [s for s in shard_names(sub_listing, read_metadata(snapshot / name, sub_listing))
                       if s not in sub_listing.files]
        if sub_missing or not any(n.endswith(".safetensors") for n in sub_listing.files):
            return gap(lambda: f"{repo_id}@{commit[:12]} in the HF cache lacks {name}/ "
                               f"{', '.join(sorted(sub_missing)[:3]) or 'weights'}")
    return with_subfolders(raw, snapshot, listing, metadata, subfolders, kind="hf-cache")


def cached_repo_files(repo_id: str) -> list[str]:
    """Sorted names of the files any cached revision of ``repo_id`` holds, through huggingface_hub's own
    cache scan (``scan_cache_dir``: it reads the layout and skips what it finds corrupted); [] without a
    cache, without the repo, or when huggingface_hub finds the repo corrupted (a blob missing behind a
    link). For error messages that say what the cache does hold."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(hub_cache_dir())
    except (CacheNotFound, OSError, ValueError):
        return []
    names: set[str] = set()
    for repo in info.repos:
        if repo.repo_type == "model" and repo.repo_id == repo_id:
            for rev in repo.revisions:
                names.update(f.file_path.relative_to(rev.snapshot_path).as_posix() for f in rev.files)
    return sorted(names)
