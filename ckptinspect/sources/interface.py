"""What every checkpoint source provides, and the small helpers they share."""

from __future__ import annotations

import errno
import gc
import os
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ckptinspect.json_text import decode_json
from ckptinspect.errors import ConfigError, HeaderError, NotFoundError, SourceError
from ckptinspect.guarded_file import NotRegularFile, open_regular_file
from ckptinspect.header.parser import PREFIX_BYTES, read_length_prefix

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
GENERATION_CONFIG = "generation_config.json"
INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# ModelSlim's per-tensor type map: SGLang reads it whenever the checkpoint has it, ahead of config.json's
# quantization_config (SG:configs/model_config.py _find_quant_modelslim_config); read only when listed.
QUANT_MODEL_DESCRIPTION = "quant_model_description.json"
JSON_FILES = (CONFIG, HF_QUANT_CONFIG, GENERATION_CONFIG, INDEX, QUANT_MODEL_DESCRIPTION)

# Files that deserialize through pickle: never loaded, only reported.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")

# Size caps, checked (st_size) before a JSON file is read, so a huge or sparse file is refused in
# bounded time and memory. Real config / quantization / generation configs are 1-100 kB: 16 MiB is
# >100x that. The largest real index known (nvidia/Qwen3.5-397B-A17B-NVFP4, 371k tensors) is 41 MB;
# 512 MiB leaves room for ~4.5M tensors while bounding the parse (~10x the file in memory).
MAX_JSON_FILE_BYTES = 16 * 1024 ** 2
MAX_INDEX_FILE_BYTES = 256 * 1024 ** 2  # the 371k-tensor Qwen3.5-397B index is 39 MiB


def json_file_cap(name: str) -> int:
    """The size cap of the JSON metadata file ``name``."""
    # the type map has one entry per tensor, like the index
    per_tensor = name.endswith(".index.json") or name == QUANT_MODEL_DESCRIPTION
    return MAX_INDEX_FILE_BYTES if per_tensor else MAX_JSON_FILE_BYTES


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building large acyclic JSON trees.

    json.loads of a 41 MB index allocates ~1M containers, which triggers many full collections that
    find nothing (measured: ~2x slower header parsing with the collector on).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_json_bytes(data: bytes, *, source: str) -> Any:
    """Decode a JSON metadata file (config.json decoding: json_text.py), one-line ConfigError on failure."""
    with gc_paused():
        return decode_json(data, source=source)


def shard_names_from_index(index: Any, *, source: str = INDEX) -> tuple[str, ...]:
    """The unique shard files named by an index's weight_map, in first-seen order, validated."""
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise ConfigError("has no 'weight_map' object", path=source)
    try:
        shards = dict.fromkeys(index["weight_map"].values())
    except TypeError:  # an unhashable (list / object) value
        raise ConfigError("weight_map values must be file names", path=source) from None
    for shard in shards:
        check_relative_name(shard, source=source)
    return tuple(shards)


def check_relative_name(name: Any, *, source: str) -> None:
    """Reject index entries that are not plain relative paths inside the checkpoint."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ConfigError(f"weight_map names a shard {name!r} that is not a file name", path=source)
    if name.endswith(("/", os.sep)):  # normpath would drop it: "shard.safetensors/" names a directory
        raise ConfigError(f"weight_map entry '{name}' ends with a slash: a directory, not a shard file", path=source)
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep) or "\\" in name:
        raise ConfigError(f"weight_map entry '{name}' points outside the checkpoint directory", path=source)


def open_regular(path: Path, *, source: str, what: str = "file") -> tuple[int, int]:
    """Open ``path`` for reading only if it is a regular file; returns (descriptor, size).

    The checks (stat before the open, fstat after it, O_NONBLOCK between) are
    ``guarded_file.open_regular_file``'s; this words their failures for checkpoint files.

    Raises:
        NotFoundError: missing.  SourceError: not a regular file, a symlink loop, or unreadable.
    """
    try:
        return open_regular_file(path)
    except NotRegularFile:
        raise SourceError(f"{what} is not a regular file", path=source) from None
    except FileNotFoundError:
        raise NotFoundError(f"{what} is missing", path=source) from None
    except OSError as exc:
        raise _os_error(exc, source) from None


def _os_error(exc: OSError, source: str) -> SourceError:
    if exc.errno == errno.ELOOP:
        return SourceError("is a symlink loop", path=source)
    return SourceError(f"cannot read ({exc.strerror or exc})", path=source)


def read_header_file(path: Path, *, source: str) -> tuple[bytes, int]:
    """Read just the header bytes of a local safetensors file; returns (header bytes, file size)."""
    try:
        fd, size = open_regular(path, source=source, what="shard file")
        with open(fd, "rb", closefd=True) as handle:
            prefix = handle.read(PREFIX_BYTES)
            length = read_length_prefix(prefix, source=source, file_size=size)
            data = handle.read(length)
    except (HeaderError, SourceError):
        raise
    except OSError as exc:
        raise _os_error(exc, source) from None
    if len(data) != length:
        raise HeaderError(f"header truncated: {len(data):,} of {length:,} bytes", path=source)
    return data, size


def read_file_bytes(path: Path, *, limit: int | None = None) -> bytes:
    """A local JSON file's bytes: a regular file of at most ``limit`` bytes (default: its name's cap),
    refused by size before anything is read; one-line errors for unreadable files and symlink loops."""
    source = str(path)
    cap = json_file_cap(path.name) if limit is None else limit
    fd, size = open_regular(path, source=source)
    try:
        with open(fd, "rb", closefd=True) as handle:
            if size > cap:
                raise ConfigError(f"is {size:,} bytes, over the {cap:,}-byte cap for this file", path=source)
            data = handle.read(cap + 1)
    except OSError as exc:
        raise _os_error(exc, source) from None
    if len(data) > cap:  # grew after the stat
        raise ConfigError(f"is over the {cap:,}-byte cap for this file", path=source)
    return data


class LazyJson(Mapping[str, Any]):
    """name -> parsed JSON, where some files are parsed only when first asked for: a local checkpoint's
    (header scans start before the index parse) and the Hub index read by a child process (the report
    needs only its summary; a snapshot or a mismatch explanation needs all of it)."""

    def __init__(self, parsed: Mapping[str, Any], loaders: Mapping[str, Callable[[], bytes]], *, prefix: str) -> None:
        self._parsed = dict(parsed)
        self._loaders = dict(loaders)
        self._prefix = prefix

    def __getitem__(self, name: str) -> Any:
        if name not in self._parsed:
            loader = self._loaders[name]  # KeyError for unknown names, as a dict
            self._parsed[name] = parse_json_bytes(loader(), source=f"{self._prefix}/{name}")
        return self._parsed[name]

    def __contains__(self, name: object) -> bool:
        return name in self._parsed or name in self._loaders  # without parsing

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._parsed), **dict.fromkeys(self._loaders)})

    def __len__(self) -> int:
        return len(set(self._parsed) | set(self._loaders))


def lazy_json_files(directory: Path, names: tuple[str, ...]) -> LazyJson:
    """The JSON files ``names`` of a local directory, each read and parsed on first access."""
    return LazyJson({}, {name: partial(read_file_bytes, directory / name) for name in names}, prefix=str(directory))


class LocalHeaders(Mapping[str, bytes]):
    """shard -> header bytes of a local checkpoint, read from disk on access.

    ``candidates`` are the safetensors files present (scanning can start on them at once);
    the real shard list comes from ``resolve`` (the index, parsed lazily).
    """

    def __init__(self, directory: Path, candidates: Mapping[str, int], resolve: Callable[[], tuple[str, ...]]) -> None:
        self.directory = directory
        self.candidates = dict(candidates)  # name -> file size
        self._resolve = resolve
        self._shards: tuple[str, ...] | None = None

    @property
    def shards(self) -> tuple[str, ...]:
        if self._shards is None:
            self._shards = self._resolve()
        return self._shards

    def __getitem__(self, shard: str) -> bytes:
        return read_header_file(self.directory / shard, source=shard)[0]

    def __iter__(self) -> Iterator[str]:
        return iter(self.shards)

    def __len__(self) -> int:
        return len(self.shards)


class LocalSizes(Mapping[str, "int | None"]):
    """shard -> file size for a LocalHeaders (stat on demand for shards that were not candidates)."""

    def __init__(self, headers: LocalHeaders) -> None:
        self.headers = headers

    def __getitem__(self, shard: str) -> int:
        size = self.headers.candidates.get(shard)
        if size is not None:
            return size
        path = self.headers.directory / shard
        try:
            return path.stat().st_size
        except FileNotFoundError:
            raise NotFoundError(f"shard '{shard}' named by the index is missing",
                                path=str(self.headers.directory)) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SourceError("is a symlink loop", path=str(path)) from None
            raise SourceError(f"cannot stat ({exc.strerror or exc})", path=str(path)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.headers)

    def __len__(self) -> int:
        return len(self.headers)
