"""Metadata snapshots: a checkpoint's config files, index and every shard header in one ``.json.gz``.

A snapshot is enough to rerun ``report`` offline with the same result (bug reports, CI, sharing) while
holding no weights: the 94-shard Qwen3.5-397B NVFP4 metadata (41 MB index + 49.6 MB of headers) gzips to a
few MB. Format (``format_version`` 1, documented in docs/hub_and_wire.md)::

    {"format": "ckptinspect-snapshot", "format_version": 1, "created_by": "ckptinspect 0.1.0",
     "source": {"ref", "kind", "location", "revision"},
     "files": [...], "shards": [shard order of the source], "json_files": {...}, "file_sizes": {shard: int|null},
     "headers": {shard: header JSON text, byte-exact (trailing padding kept)},
     "headers_base64": {shard: base64}   # only for headers that are not valid UTF-8
     "stats": {...}}                     # how the source was read (requests, bytes)

Written with gzip mtime 0 and sorted keys, so the same checkpoint gives the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any

from ckptinspect.json_text import decode_json
from ckptinspect.errors import ConfigError, NotFoundError, SourceError
from ckptinspect.records import RawCheckpoint
from ckptinspect.gc_pause import gc_paused
from ckptinspect.header.index import INDEX, summarize_index
from ckptinspect.sources.interface import open_regular

FORMAT = "ckptinspect-snapshot"
FORMAT_VERSION = 1
# Uncompressed size cap (refuses gzip bombs): the 371k-tensor Qwen3.5-397B NVFP4 snapshot is 90 MiB
# uncompressed, so 256 MiB is ~2.8x the largest known. With the value cap below it bounds the parse's
# memory (a 1.8 MiB gzip of 400 MiB JSON reached 7 GB under the old 512 MiB cap and no value cap).
MAX_SNAPSHOT_BYTES = 256 * 1024 ** 2
# Values the snapshot's JSON may build (json_text.py counts them before parsing): that snapshot
# counts 3.16M (header strings over-count), so 12M is ~3.8x it.
MAX_SNAPSHOT_ITEMS = 12_000_000
# Hugging Face cache layout: <cache>/models--org--name/{blobs,refs,snapshots/<rev>}; every folder of a
# repo is the cache's, so a snapshot is written into none of them (blobs are content-addressed and
# snapshot files are links into them).
HF_CACHE_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def write_snapshot(raw: RawCheckpoint, path: Path) -> None:
    """Write ``raw`` to ``path`` (gzip JSON), atomically. Never inside the model directory.

    Raises:
        SourceError: ``path`` lies inside the checkpoint's own directory (local or HF cache snapshot).
    """
    path = Path(path)
    target = path.resolve()
    if raw.kind in ("local", "hf-cache"):
        for protected, what in _protected_dirs(Path(raw.location)):
            if target == protected or protected in target.parents:
                raise SourceError(f"refusing to write a snapshot into {what}", path=str(path),
                                  hint="choose an output path outside it")
    headers: dict[str, str] = {}
    headers_b64: dict[str, str] = {}
    for shard, data in raw.headers.items():
        try:
            headers[shard] = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            headers_b64[shard] = base64.b64encode(bytes(data)).decode("ascii")
    from ckptinspect import __version__

    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_by": f"ckptinspect {__version__}",
        "source": _provenance(raw),
        "files": list(raw.files),
        "shards": list(raw.headers),  # the source's shard order (JSON objects below are key-sorted)
        "json_files": dict(raw.json_files),
        "file_sizes": dict(raw.file_sizes),
        "headers": headers,
        "stats": _jsonable(raw.stats),
    }
    if headers_b64:
        doc["headers_base64"] = headers_b64
    payload = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw_fh, gzip.GzipFile(filename="", mode="wb", fileobj=raw_fh,
                                                          mtime=0, compresslevel=6) as gz:
            gz.write(payload)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _protected_dirs(location: Path) -> list[tuple[Path, str]]:
    """The model directory and, when it lies in a Hugging Face cache, the whole repo folder."""
    model_dir = location.resolve()
    found = [(model_dir, "the model directory")]
    for folder in (model_dir, *model_dir.parents):
        if folder.name.startswith(HF_CACHE_REPO_PREFIXES) and (folder / "snapshots").is_dir():
            found.append((folder, "a Hugging Face cache repo folder"))
            break
    return found


def read_snapshot(path: Path) -> RawCheckpoint:
    """Restore a RawCheckpoint (kind ``snapshot``) from a file written by :func:`write_snapshot`.

    Raises:
        NotFoundError: no such file.  ConfigError: not a gzip JSON snapshot, or an unknown format_version.
    """
    path = Path(path)
    try:
        fd, _ = open_regular(path, source=str(path), what="snapshot file")
    except NotFoundError:
        raise NotFoundError("snapshot file not found", path=str(path)) from None
    try:
        with open(fd, "rb", closefd=True) as raw_fh, gzip.GzipFile(fileobj=raw_fh, mode="rb") as fh:
            payload = fh.read(MAX_SNAPSHOT_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise ConfigError(f"not a gzip file: {exc}", path=str(path)) from None
    if len(payload) > MAX_SNAPSHOT_BYTES:
        raise ConfigError(f"uncompressed snapshot over {MAX_SNAPSHOT_BYTES:,} bytes", path=str(path))
    with gc_paused():
        doc = decode_json(payload, source=str(path), what="not a JSON snapshot", max_items=MAX_SNAPSHOT_ITEMS)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"not a ckptinspect snapshot (format != {FORMAT!r})", path=str(path))
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ConfigError(f"snapshot format_version {version!r} is not supported (this ckptinspect reads "
                          f"{FORMAT_VERSION})", path=str(path), hint="upgrade ckptinspect")
    try:
        for key, kind in (("headers", dict), ("json_files", dict), ("file_sizes", dict), ("files", list),
                          ("source", dict)):
            if not isinstance(doc[key], kind):
                raise TypeError(f"'{key}' is not a JSON {'object' if kind is dict else 'array'}")
        if not all(isinstance(f, str) for f in doc["files"]):
            raise TypeError("'files' must list file names")
        loaded = {k: v.encode("utf-8") for k, v in doc["headers"].items()}
        loaded.update({k: base64.b64decode(v) for k, v in doc.get("headers_base64", {}).items()})
        order = doc.get("shards", sorted(loaded))
        if sorted(order) != sorted(loaded):
            raise ValueError("'shards' does not list the same files as 'headers'")
        headers = {shard: loaded[shard] for shard in order}
        rank = {shard: i for i, shard in enumerate(order)}  # list.index per file was quadratic
        source = doc["source"]
        json_files = doc["json_files"]
        # The one parse of the index was the snapshot's; its one summary is made here, as every source does.
        summary = summarize_index(json_files[INDEX], source=f"{path}/{INDEX}") if INDEX in json_files else None
        return RawCheckpoint(
            ref=str(path),
            kind="snapshot",
            location=str(path),
            files=tuple(doc["files"]),
            json_files=json_files,
            headers=headers,
            file_sizes={k: (int(v) if v is not None else None)
                        for k, v in sorted(doc["file_sizes"].items(), key=lambda kv: _position(rank, kv[0]))},
            revision=source.get("revision"),
            stats={"requests": 0, "bytes_fetched": 0, "snapshot_of": source, "snapshot_stats": doc.get("stats", {})},
            index_summary=summary,
        )
    except (KeyError, AttributeError, TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"snapshot is missing or has a malformed field: {exc}", path=str(path)) from None


def _provenance(raw: RawCheckpoint) -> dict[str, Any]:
    """Where the metadata came from; a snapshot of a snapshot keeps the original source."""
    original = raw.stats.get("snapshot_of") if raw.kind == "snapshot" else None
    if isinstance(original, dict):
        return dict(original)
    return {"ref": raw.ref, "kind": raw.kind, "location": raw.location, "revision": raw.revision}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _position(rank: dict[str, int], shard: str) -> tuple[int, str]:
    return (rank.get(shard, len(rank)), shard)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
