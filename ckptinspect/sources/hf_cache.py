"""A repo id answered from the local Hugging Face cache, without any network access.

Cache layout (huggingface_hub ``file_download.py``, documented in ``hf_api.py`` ``scan_cache_dir``)::

    $HF_HUB_CACHE/models--{org}--{name}/
        blobs/{etag}                        file contents (git blob sha1, or sha256 for LFS files)
        refs/{branch or tag}                the commit hash that revision pointed to
        snapshots/{commit}/{file}           relative symlink -> ../../blobs/{etag}

The cache directory is read from the environment at call time (HF_HUB_CACHE, else HF_HOME/hub, else
XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub), so a changed HF_HOME is honoured even after
huggingface_hub was imported. A repo counts as cached when its snapshot holds config.json and every shard
(all ``weight_map`` values of the index, or ``model.safetensors``); headers are then read from those files.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ckptinspect.errors import NotFoundError, SourceError
from ckptinspect.records import RawCheckpoint
from ckptinspect.sources.offline import hub_offline

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_COMMIT = re.compile(r"[0-9a-f]{40}")
# Blob names huggingface_hub uses: a git blob sha1 or an LFS sha256. The etag comes from the server (repo
# info, X-Linked-Etag): anything else could name a path outside the cache, so it is not stored.
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def hub_cache_dir() -> Path:
    """The HF hub cache directory, resolved from the environment now."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HUGGINGFACE_HUB_CACHE"):  # legacy name, still honoured by huggingface_hub
        return Path(env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def repo_storage(repo_id: str) -> Path:
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def resolve_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit a revision points to in the cache (a 40-hex revision is itself), None if unknown."""
    rev = revision or "main"
    if _COMMIT.fullmatch(rev):
        return rev
    ref = repo_storage(repo_id) / "refs" / rev
    if not os.path.lexists(ref):
        return None
    from ckptinspect.guarded_file import MAX_REF_BYTES, read_text

    # A ref is a small regular file; a FIFO, a device or a huge file there is one error line, not a hang.
    commit = read_text(ref, what="HF cache ref", cap=MAX_REF_BYTES, error=SourceError).strip()
    return commit if _COMMIT.fullmatch(commit) else None


def cached_file(repo_id: str, commit: str, filename: str) -> Path | None:
    """The cached copy of ``filename`` at ``commit`` (a resolved blob), or None."""
    path = repo_storage(repo_id) / "snapshots" / commit / filename
    return path if path.is_file() else None


def cache_store(repo_id: str, commit: str, revision: str | None, filename: str, data: bytes,
                etag: str | None, *, source_fd: int | None = None) -> None:
    """Put ``data`` into the cache as huggingface_hub would (blob + relative symlink + ref).

    Best effort: a read-only or missing cache never fails the command. Without an etag (blob id) the file
    is not cached, since the blob name must be the one huggingface_hub would use. ``source_fd``: a file
    that already holds ``data`` from offset 0 (the index child's memory file); the blob is then copied
    from it by the kernel (sendfile: ~0.02 CPU-s for a 41 MB index where write() took ~0.12 here).
    """
    if not etag or not _ETAG.fullmatch(etag) or not _COMMIT.fullmatch(commit) or not _safe_ref(revision):
        return
    storage = repo_storage(repo_id)
    try:
        blob = storage / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            with tempfile.NamedTemporaryFile(dir=blob.parent, delete=False, suffix=".incomplete") as tmp:
                if source_fd is None or not _copy_from(source_fd, tmp.fileno(), len(data)):
                    tmp.seek(0)
                    tmp.truncate()
                    tmp.write(data)
            os.replace(tmp.name, blob)
        pointer = storage / "snapshots" / commit / filename
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if not pointer.exists():
            try:
                pointer.symlink_to(os.path.relpath(blob, pointer.parent))
            except OSError:  # no symlinks (some Windows setups): huggingface_hub copies too
                pointer.write_bytes(data)
        if revision and revision != commit:
            ref = storage / "refs" / revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(commit)
    except OSError:
        return


def _copy_from(source_fd: int, target_fd: int, size: int) -> bool:
    """Copy bytes [0, size) of ``source_fd`` to ``target_fd`` in the kernel; False when that is not
    possible here (then the caller writes the bytes it holds)."""
    if not hasattr(os, "sendfile"):
        return False
    done = 0
    try:
        while done < size:
            sent = os.sendfile(target_fd, source_fd, done, size - done)
            if sent <= 0:
                return False
            done += sent
    except OSError:
        return False
    return True


def _safe_ref(revision: str | None) -> bool:
    """A branch / tag name usable as a path under refs/ (``refs/pr/1`` is; ``..``, absolute paths are not)."""
    if not revision:
        return True
    parts = revision.split("/")
    return not revision.startswith(("/", "\\")) and all(p not in ("", ".", "..") and "\\" not in p for p in parts)


def _shards_wanted(snapshot: Path) -> tuple[list[str] | None, str | None]:
    """Shard names the snapshot must hold; (None, reason) when that cannot be known from the cache."""
    index_path = snapshot / INDEX_FILE
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
    missing = [] if (snapshot / "config.json").is_file() else ["config.json"]
    shards, reason = _shards_wanted(snapshot)
    if reason:
        missing.append(reason)
    missing += [s for s in shards or [] if not (snapshot / s).is_file()]
    if not missing:
        return ""
    head = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"{repo_id}@{commit[:12]} in the HF cache lacks {head}"


def open_hf_cache(repo_id: str, *, revision: str | None = None, required: bool | None = None) -> RawCheckpoint | None:
    """Read ``repo_id@revision`` from the HF cache; None when not fully cached.

    Args:
        required: raise NotFoundError naming what is missing instead of returning None. Defaults to
            HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): offline, the caller cannot fall back to the Hub,
            so the error says which file the cache lacks.
    """
    if required is None:
        required = hub_offline()
    gap = describe_cache_gap(repo_id, revision)
    if gap:
        if required:
            raise NotFoundError(f"HF_HUB_OFFLINE=1 and {gap}", path=repo_id,
                                hint="run once online, or use a .json.gz snapshot")
        return None
    commit = resolve_commit(repo_id, revision)
    assert commit is not None
    snapshot = repo_storage(repo_id) / "snapshots" / commit
    ref = repo_id if revision is None else f"{repo_id}@{revision}"
    # The local-directory source reads the same layout (headers lazily: prefix + N bytes only).
    from ckptinspect.sources.local import open_local

    return open_local(snapshot, ref=ref, kind="hf-cache", revision=commit)
