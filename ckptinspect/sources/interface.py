"""What every checkpoint source provides (the ``Source`` protocol), and the small helpers they share."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol, Union, runtime_checkable

from ckptinspect.gc_pause import gc_paused
from ckptinspect.header.index import INDEX, MISTRAL_INDEX, PARAMS, check_relative_name, shard_names_from_index
from ckptinspect.json_text import decode_index_json, decode_json
from ckptinspect.errors import ConfigError, HeaderError, NotFoundError, SourceError
from ckptinspect.guarded_file import NotRegularFile, open_regular_file
from ckptinspect.header.parser import PREFIX_BYTES, read_length_prefix
from ckptinspect.records import RawCheckpoint

if TYPE_CHECKING:
    from ckptinspect.sources.gguf_files import RawGguf

__all__ = ["Source", "INDEX", "check_relative_name", "shard_names_from_index", "gc_paused"]

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
GENERATION_CONFIG = "generation_config.json"
SINGLE_FILE = "model.safetensors"
# ModelSlim's per-tensor type map: SGLang reads it whenever the checkpoint has it, ahead of config.json's
# quantization_config (SG:configs/model_config.py _find_quant_modelslim_config); read only when listed.
QUANT_MODEL_DESCRIPTION = "quant_model_description.json"
# params.json and its index: Mistral's own format, read where vLLM reads it (header/index.py is_mistral_format)
JSON_FILES = (CONFIG, HF_QUANT_CONFIG, GENERATION_CONFIG, INDEX, QUANT_MODEL_DESCRIPTION, PARAMS, MISTRAL_INDEX)

# Files that deserialize through pickle: never loaded, only reported.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")

# Size caps, checked (st_size) before a JSON file is read, so a huge or sparse file is refused in
# bounded time and memory. Real config / quantization / generation configs are 1-100 kB: 16 MiB is
# >100x that. The largest real index known (nvidia/Qwen3.5-397B-A17B-NVFP4, 371k tensors) is 41 MB;
# 256 MiB (MAX_INDEX_FILE_BYTES) leaves room for ~2.4M tensors while bounding the parse (~10x the file
# in memory).
MAX_JSON_FILE_BYTES = 16 * 1024 ** 2
MAX_INDEX_FILE_BYTES = 256 * 1024 ** 2  # the 371k-tensor Qwen3.5-397B index is 39 MiB
# Header bytes a local read holds at once, all shards together: a record is eager (every header read
# before the scan), so sparse files with long headers could otherwise fill memory before the first is
# parsed. The 94-shard Qwen3.5-397B NVFP4 holds 50 MB of headers: 1 GiB is ~20x it.
MAX_TOTAL_HEADER_BYTES = 1024 ** 3


def json_file_cap(name: str) -> int:
    """The size cap of the JSON metadata file ``name``."""
    # the type map has one entry per tensor, like the index
    per_tensor = name.endswith(".index.json") or name == QUANT_MODEL_DESCRIPTION
    return MAX_INDEX_FILE_BYTES if per_tensor else MAX_JSON_FILE_BYTES


def parse_json_bytes(data: bytes, *, source: str, files: Iterable[str] | None = None) -> Any:
    """Decode a JSON metadata file (config.json decoding: json_text.py), one-line ConfigError on failure.
    ``files``: for an index, the names the checkpoint lists (its safetensors files are the shard names the
    index may give: json_text.decode_index_json; the answer is decode_json's either way)."""
    with gc_paused():
        if files is not None:
            return decode_index_json(data, source=source, shard_files=(f for f in files if f.endswith(".safetensors")))
        return decode_json(data, source=source)


def is_index_file(name: str) -> bool:
    """An index of tensor names to shard files (the Hugging Face one or Mistral's consolidated one)."""
    return name in (INDEX, MISTRAL_INDEX)


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


def read_header_file(path: Path, *, source: str, left: int | None = None) -> tuple[bytes, int]:
    """Read just the header bytes of a local safetensors file; returns (header bytes, file size).

    ``left``: header bytes the caller may still hold (an eager read of every shard is bounded as a whole,
    ``MAX_TOTAL_HEADER_BYTES``); a longer header is refused before it is read."""
    try:
        fd, size = open_regular(path, source=source, what="shard file")
        with open(fd, "rb", closefd=True) as handle:
            prefix = handle.read(PREFIX_BYTES)
            length = read_length_prefix(prefix, source=source, file_size=size)
            if left is not None and length > left:
                raise HeaderError(f"the shard headers add up to over the {MAX_TOTAL_HEADER_BYTES:,}-byte cap for "
                                  f"all headers of a checkpoint (this one: {length:,} bytes)", path=source)
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


@runtime_checkable
class Source(Protocol):
    """One kind of checkpoint reference: what ``open_source`` asks, in the registry's order
    (sources/__init__.py).

    ``claims(ref, path)`` is cheap (a suffix, ``is_dir``, a repo-id pattern, a ref file in the HF cache)
    and says whether ``ref`` is this kind's; ``open(ref, path, revision=, token=, progress=)`` does the
    I/O and returns a complete, eager record: every map a plain dict already read, the index parsed
    and summarized once (``index_summary``), so no consumer needs to know which kind it came from.
    ``open`` returns None only when a claim turns out not to hold once read (the HF cache lacks a
    shard): ``open_source`` then asks the next kind.
    """

    name: str

    def claims(self, ref: str, path: Path) -> bool: ...

    def open(self, ref: str, path: Path, *, revision: str | None, token: str | None,
             progress: bool) -> "Union[RawCheckpoint, RawGguf, None]": ...
