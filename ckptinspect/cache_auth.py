"""The per-user key that authenticates every entry of ckptinspect's on-disk caches.

Why a key and not a checksum: a cache directory is often shared or restored from a shared store (CI
runners restore ``~/.cache`` between jobs, and a pull request's job can write what the next job
restores). A sha256 anyone can recompute, so an edited entry with a recomputed checksum used to change
an answer (issue 36: a header entry with its ``mtp.*`` tensors renamed turned both MTP verdicts from
ready to unusable; an edited audit report flipped ``audit --fail-on``). An HMAC-SHA256 under a secret
the cache does not hold cannot be recomputed by whoever can write the cache, so such an entry is a miss
(read again from its source), never an answer.

Where the key lives: ``Settings.cache_key_file`` (ckptinspect/settings.py: ``$CKPTINSPECT_CACHE_KEY_FILE``,
else ``$XDG_CONFIG_HOME/ckptinspect/cache-key``, default ``~/.config/ckptinspect/cache-key``): the config directory, not the cache directory, because
CI caches restore the latter. It is created on first use (32 random bytes as 64 hex digits, mode 0600,
in a 0700 directory, made whole before it appears: written to a temporary name and hard-linked into
place, so two processes racing to create it agree on one key). It is used only when it is a regular
file of the current user, readable by nobody else, and not inside the cache directory it would
authenticate (a key restored with the cache authenticates nothing). Otherwise there is no key and
every cache lookup is a miss and nothing is stored: a missing key costs time, never an answer.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path

KEY_FILE_ENV = "CKPTINSPECT_CACHE_KEY_FILE"
_KEY_TEXT = re.compile(rb"[0-9a-f]{64}\n?")
_MAX_KEY_FILE_BYTES = 128


def _inside(path: Path, root: Path) -> bool:
    try:
        path = path.resolve()
        root = root.resolve()
    except (OSError, RuntimeError):
        return True  # cannot tell: treat as unsafe
    return path == root or root in path.parents


def _read_key(path: Path) -> bytes | None:
    from ckptinspect.guarded_file import NotRegularFile, open_regular_file

    try:
        fd, size = open_regular_file(path)
    except (NotRegularFile, OSError):
        return None
    try:
        info = os.fstat(fd)
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o077):
            return None  # someone else's key, or one others can read (and so forge with)
        if size > _MAX_KEY_FILE_BYTES:
            return None
        data = os.read(fd, _MAX_KEY_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not _KEY_TEXT.fullmatch(data):
        return None
    return bytes.fromhex(data[:64].decode("ascii"))


def _create_key(path: Path) -> None:
    """Make the key file whole under a temporary name, then link it into place (fails if one exists)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_hex(32).encode("ascii") + b"\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: its key is the one
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def cache_key(cache_root: Path, key_file: Path | None, cache_base: Path | None = None) -> bytes | None:
    """The 32-byte key in ``key_file`` (``Settings.cache_key_file``), created on first use; None when there is
    no trustworthy key (no caching then): no key file named, or one that would lie in the cache directory
    (``cache_root``) or anywhere under the tool's cache base (``Settings.cache_dir``), whatever a restored
    cache holds."""
    if key_file is None:
        return None
    path = key_file
    if _inside(path, cache_root) or (cache_base is not None and _inside(path, cache_base)):
        return None
    key = _read_key(path)
    if key is not None:
        return key
    try:
        if not path.exists() and not path.is_symlink():
            _create_key(path)
    except OSError:
        return None
    return _read_key(path)


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the parts, each length-prefixed (so no two splits of the same bytes collide)."""
    tag = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        tag.update(len(part).to_bytes(8, "big"))
        tag.update(part)
    return tag.digest()


def verify(key: bytes, expected: bytes, *parts: bytes) -> bool:
    return hmac.compare_digest(mac(key, *parts), expected)


__all__ = ["KEY_FILE_ENV", "cache_key", "mac", "verify"]
