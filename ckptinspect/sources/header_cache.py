"""A cache of safetensors headers read from the Hub, so a second report of the same revision asks the Hub
for the repo info only (and no header).

Why a cached header needs no revalidation: the key is immutable. It is (endpoint without userinfo, repo,
commit sha, file name, the file's etag, the file's size), and the Hub reader learns the commit and each
file's etag and size from the repo-info call it makes anyway (``/api/models/{repo}/revision/{rev}?blobs=True``,
sources/repo_info.py): for an LFS file the etag is its ``lfs.sha256``, for a plain git file its blob id,
the same values huggingface_hub uses as etags and blob names (``file_download.py``
``_normalize_etag`` / ``X-Linked-Etag``). A commit sha pins every file's bytes, so the header under a key
can never change. Nothing is looked up unless the repo info named a 40-hex commit: a branch name whose
commit is unknown is never a key. The repo-info call is made (with the token) before any lookup, so a
repo that is private to the caller or gone is an error as without the cache; a gated repo's info is
public and only its files are gated, so its cached headers are used without a new access check, as
huggingface_hub returns a cached file of a commit hash without a request (file_download.py
``_hf_hub_download_to_cache_dir``).

Entries live in ``hub-headers/`` under the settings' cache directory (``$CKPTINSPECT_CACHE_DIR``, default
``$XDG_CACHE_HOME/ckptinspect`` or ``~/.cache/ckptinspect``: ckptinspect/settings.py; a ``Settings``
without one has no header cache), one file per key, named by the key's sha256::

    MAGIC (8 bytes) | key length (4 bytes, big-endian) | key | HMAC-SHA256(user key; key, payload) | payload

where the payload is the file's first ``8 + n`` bytes (the little-endian length prefix and the header).
The MAC is under the per-user key of ckptinspect/cache_auth.py, kept outside the cache directory: a
checksum anyone can recompute let an edited entry (``mtp.*`` tensors renamed, sha256 recomputed) change
the MTP verdicts (issue 36), and a cache restored from a shared CI store is writable by others. Without a
usable key nothing is looked up or stored.
A read re-derives everything: the magic, the key equal to the one asked for, the MAC, the
prefix equal to the payload length and within the file size the key names, the 25,000,000-byte header limit. Anything else is a miss (the file
is removed and the header read from the Hub): a cache can cost a request, never change an answer or
raise. Writes are atomic (a temporary file in the same directory, then ``os.replace``; the temporary
file is removed on every path), so concurrent reports writing the same entry each leave a whole entry.

Bounded: after a run that stored entries, the oldest (by mtime; a hit refreshes it) are removed until
the directory holds at most ``Settings.header_cache_max_bytes`` (CKPTINSPECT_HEADER_CACHE_MAX_BYTES, default
512 MiB). Switched off by ``CKPTINSPECT_HEADER_CACHE=0`` or ``open_hub(header_cache=False)``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import struct
import uuid
from pathlib import Path

from ckptinspect.cache_auth import cache_key, mac
from ckptinspect.sources.header_ranges import MAX_HEADER_LENGTH
from ckptinspect.sources.redact import redact_url
from ckptinspect.settings import DEFAULTS, Settings

MAGIC = b"CKHDRC2\n"  # 1: sha256 entries, never trusted again
ENABLE_ENV = "CKPTINSPECT_HEADER_CACHE"
MAX_BYTES_ENV = "CKPTINSPECT_HEADER_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = DEFAULTS.header_cache_max_bytes  # ~10x the 94 headers (51.8 MB) of the 397B NVFP4 replica
SUBDIR = "hub-headers"
SUFFIX = ".hdr"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_MAX_KEY_BYTES = 64 * 1024
_DIGEST = 32


def cache_dir(settings: Settings = DEFAULTS) -> Path | None:
    """``hub-headers`` under the settings' cache directory (the one the tool's other caches share), or
    None when the settings name none."""
    return None if settings.cache_dir is None else settings.cache_dir / SUBDIR


def enabled(option: bool | None = None, settings: Settings = DEFAULTS) -> bool:
    """The option when given, else the settings' switch (CKPTINSPECT_HEADER_CACHE)."""
    return settings.header_cache if option is None else option


def entry_key(endpoint: str, repo_id: str, commit: str, filename: str, etag: str | None,
              size: int | None) -> bytes | None:
    """The key's canonical bytes (its fields joined by NUL, which no repo id, URL or file name the repo
    info passed holds), or None when the file is not pinned (no commit sha, etag or size)."""
    if not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        return None
    if not (isinstance(etag, str) and _ETAG.fullmatch(etag)) or not isinstance(size, int) or size < 8:
        return None
    fields = ["v1", redact_url(endpoint).rstrip("/"), repo_id, commit, filename, etag, str(size)]
    if any("\0" in field for field in fields):
        return None
    return "\0".join(fields).encode("utf-8", "surrogatepass")


class HeaderCache:
    """Header lookups and stores under one directory (``root`` None: no cache)."""

    def __init__(self, root: Path | None, limit: int | None = None, key_file: Path | None = None) -> None:
        self.root = root
        self.key_file = key_file  # the per-user MAC key (Settings.cache_key_file); None: no lookups, no stores
        self.limit = DEFAULT_MAX_BYTES if limit is None else limit
        self.stored = 0
        self._made = False  # the directory exists (made once per cache, not once per header)
        self._secret: bytes | None | bool = False  # False: not looked up yet; None: no usable key

    def secret(self) -> bytes | None:
        """The per-user MAC key (cache_auth.py), looked up once; None: no lookups, no stores."""
        if self._secret is False:
            self._secret = None if self.root is None else cache_key(self.root, self.key_file, self.root.parent)
        return self._secret  # type: ignore[return-value]

    @classmethod
    def default(cls, option: bool | None = None, settings: Settings = DEFAULTS) -> "HeaderCache":
        """The cache ``settings`` describe (``option``: on / off instead of the settings' switch)."""
        return cls(cache_dir(settings) if enabled(option, settings) else None, settings.header_cache_max_bytes,
                   settings.cache_key_file)

    def _path(self, key: bytes) -> Path:
        assert self.root is not None
        return self.root / (hashlib.sha256(key).hexdigest() + SUFFIX)

    def get(self, key: bytes | None) -> bytes | None:
        """The header (JSON bytes, without the prefix) stored under ``key``; None on any doubt."""
        if self.root is None or key is None:
            return None
        secret = self.secret()
        if secret is None:
            return None
        path = self._path(key)
        header = _read_entry(path, key, secret)
        if header is None:
            return None
        try:
            os.utime(path)  # least recently used is evicted first
        except OSError:
            pass
        return header

    def put(self, key: bytes | None, header: bytes) -> None:
        """Store ``header`` under ``key`` atomically; any OS error leaves the cache as it was."""
        if self.root is None or key is None or len(header) > MAX_HEADER_LENGTH:
            return
        secret = self.secret()
        if secret is None:
            return
        prefix = struct.pack("<Q", len(header))
        # MACed and written piece by piece: joining the pieces first would copy each header twice more
        # (~50 MB per report of a 371k-tensor checkpoint), and the copies, unlike hashing and writing,
        # hold the GIL the scan needs. The same bytes as cache_auth.mac(secret, key, prefix + header).
        digest = hmac.new(secret, digestmod=hashlib.sha256)
        digest.update(len(key).to_bytes(8, "big"))
        digest.update(key)
        digest.update((len(prefix) + len(header)).to_bytes(8, "big"))
        digest.update(prefix)
        digest.update(header)
        head = MAGIC + struct.pack(">I", len(key)) + key + digest.digest() + prefix
        if len(head) + len(header) > self.limit:
            return
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            if not self._made:
                self.root.mkdir(parents=True, exist_ok=True)
                self._made = True
            with open(tmp, "xb") as out:
                out.write(head)
                out.write(header)
            os.replace(tmp, path)
            self.stored += 1
        except OSError:
            pass
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass  # already renamed (the usual case) or never created

    def evict(self) -> int:
        """Remove the oldest entries until the directory holds at most ``limit`` bytes; bytes kept."""
        if self.root is None:
            return 0
        entries = []
        try:
            with os.scandir(self.root) as scan:
                for entry in scan:
                    if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        entries.append((info.st_mtime, entry.name, info.st_size))
        except OSError:
            return 0
        total = sum(size for _, _, size in entries)
        for _, name, size in sorted(entries):
            if total <= self.limit:
                break
            _remove(self.root / name)
            total -= size
        return total


def _read_entry(path: Path, key: bytes, secret: bytes) -> bytes | None:
    limit = len(MAGIC) + 4 + len(key) + _DIGEST + 8 + MAX_HEADER_LENGTH
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            blob = None
        else:
            with os.fdopen(os.dup(fd), "rb") as src:
                blob = src.read(limit + 1)
    except OSError:
        blob = None
    finally:
        os.close(fd)
    header = None if blob is None else _decode(blob, key, secret)
    if header is None and blob is not None:
        _remove(path)  # a damaged or foreign entry: read again from the Hub and stored anew
    return header


def _decode(blob: bytes, key: bytes, secret: bytes) -> bytes | None:
    head = len(MAGIC) + 4
    if len(blob) < head or blob[:len(MAGIC)] != MAGIC:
        return None
    (key_len,) = struct.unpack(">I", blob[len(MAGIC):head])
    if key_len != len(key) or key_len > _MAX_KEY_BYTES or blob[head:head + key_len] != key:
        return None
    digest = blob[head + key_len:head + key_len + _DIGEST]
    payload = blob[head + key_len + _DIGEST:]
    if len(digest) != _DIGEST or len(payload) < 8 or not hmac.compare_digest(mac(secret, key, payload), digest):
        return None
    (n,) = struct.unpack("<Q", payload[:8])
    size = int(key.rsplit(b"\0", 1)[1])  # the key is this module's own (entry_key): its last field
    if n != len(payload) - 8 or n > MAX_HEADER_LENGTH or 8 + n > size:
        return None
    return payload[8:]


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


__all__ = ["HeaderCache", "entry_key", "cache_dir", "enabled", "ENABLE_ENV", "MAX_BYTES_ENV",
           "DEFAULT_MAX_BYTES"]
