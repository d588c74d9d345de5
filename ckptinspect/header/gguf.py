"""Bounded, validating GGUF header parser: metadata key/values and tensor infos, never tensor data.

Layout (ggml-org/ggml:docs/gguf.md; llama.cpp ggml/src/gguf.cpp ``gguf_init_from_file_impl``): magic ``GGUF``,
u32 version (2 or 3; version 1 used 32-bit counts and is refused, as llama.cpp does), u64 tensor count,
u64 key/value count, the key/values (u64-length UTF-8 key, u32 value type, value; arrays are u32 item
type + u64 count + items), the tensor infos (name, u32 n_dims, u64 dims, u32 ggml type, u64 offset),
padding to ``general.alignment`` (default 32), then the data section every offset is relative to.
Files written on big-endian hosts store every number big-endian; the version field tells which.

The parser reads through a :class:`ByteWindow`, which may hold only the first bytes of the file and
asks its ``extend`` callback for more as the metadata requires (the Hub source reads ranges that way,
sized from what the parser already knows: the remaining count of an array times the mean item size
so far). Every count, length and depth is checked against a cap and against the bytes that can still
follow before anything is allocated, so a hostile header fails in bounded time and memory with one
line naming the file.

Arrays longer than :data:`MAX_KEPT_ARRAY` items (tokenizer vocabularies, merges) are walked and kept
as a :class:`GgufArray` summary (item type, count): nothing downstream needs 150k token strings.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from typing import Any, Callable, Mapping

from ckptinspect.errors import HeaderError
from ckptinspect.header.gguf_types import GGML_TYPES

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # gguf-py constants.py GGUF_DEFAULT_ALIGNMENT
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 4  # ggml GGML_MAX_DIMS
MAX_TENSORS = 1 << 20  # real files hold ~1-3k; a MoE split at 160 files stays far below
MAX_KV = 1 << 16  # real files hold ~30-60 keys
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 16 << 20  # one string value (chat templates are ~10-100 kB)
MAX_ARRAY_DEPTH = 3  # gguf.cpp reads no nested arrays at all; the writer can nest one level
MAX_KEPT_ARRAY = 4096  # per-layer arrays (block_count items) are kept, vocabularies summarized
MAX_KEPT_ITEMS = 1 << 16  # array items kept over a whole header (real headers keep a few hundred)
MAX_HEADER_BYTES = 512 << 20  # ~30x the largest real header (262k-token vocabularies, ~15 MB)

# GGUF value types (gguf-py constants.py ``class GGUFValueType``): id -> (name, struct code, size)
VALUE_TYPES: dict[int, tuple[str, str, int]] = {
    0: ("UINT8", "B", 1), 1: ("INT8", "b", 1), 2: ("UINT16", "H", 2), 3: ("INT16", "h", 2),
    4: ("UINT32", "I", 4), 5: ("INT32", "i", 4), 6: ("FLOAT32", "f", 4), 7: ("BOOL", "?", 1),
    8: ("STRING", "", 8), 9: ("ARRAY", "", 12), 10: ("UINT64", "Q", 8), 11: ("INT64", "q", 8),
    12: ("FLOAT64", "d", 8),
}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GgufArray:
    """A long array, walked but not kept: its item type name and length."""

    item_type: str
    count: int


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: ne[0] (the contiguous row length) first
    ggml_type: str
    offset: int  # relative to the data section
    nbytes: int
    elements: int


@dataclass(frozen=True)
class GgufHeader:
    """One validated GGUF header. ``header_bytes`` is where the data section starts."""

    version: int
    big_endian: bool
    metadata: Mapping[str, Any]  # key -> int | float | bool | str | tuple | GgufArray
    value_types: Mapping[str, str]  # key -> GGUF value type name (ARRAY[<item>] for arrays)
    tensors: tuple[GgufTensorInfo, ...]
    alignment: int
    header_bytes: int  # aligned end of the tensor infos = start of the data section
    data_bytes: int  # end of the last tensor's data, relative to the data section
    file_size: int | None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


class GgufTruncated(HeaderError):
    """The bytes end before the header does."""


class ByteWindow:
    """The first bytes of one file, extended on demand.

    ``extend(start, stop)`` returns bytes ``[start, stop)`` of the file (fewer only at its end);
    None means the window already holds everything there is to read.
    """

    def __init__(self, data: Any, *, source: str, file_size: int | None = None,
                 extend: Callable[[int, int], bytes] | None = None, cap: int = MAX_HEADER_BYTES) -> None:
        self.data = data if extend is None else bytearray(data)
        self.source = source
        self.file_size = file_size
        self.cap = cap if file_size is None else min(cap, file_size)
        self._extend = extend

    def ensure(self, end: int, want: int = 0) -> None:
        """Make bytes [0, end) available; fetch up to ``want`` if more is fetched anyway."""
        have = len(self.data)
        if end <= have:
            return
        if end > self.cap:
            if self.file_size is not None and end > self.file_size:
                raise GgufTruncated(f"truncated GGUF header: needs byte {end:,} of a {self.file_size:,}-byte file",
                                    path=self.source)
            raise HeaderError(f"GGUF header runs past {self.cap:,} bytes (the cap for a header)", path=self.source)
        if self._extend is None:
            raise GgufTruncated(f"truncated GGUF header: needs byte {end:,}, the file has {have:,}",
                                path=self.source)
        # At least 1/64 of what is held (1 KiB to 64 KiB) per extension: the short keys after a
        # vocabulary would otherwise cost a request each, for at most ~1.6% read past the header.
        stop = min(max(end, want, have + min(64 << 10, max(1 << 10, have >> 6))), self.cap)
        more = self._extend(have, stop)
        self.data += more
        if len(self.data) < end:
            raise GgufTruncated(f"truncated GGUF header: needs byte {end:,}, got {len(self.data):,}",
                                path=self.source)


class _Parser:
    def __init__(self, window: ByteWindow) -> None:
        self.w = window
        self.pos = 0
        self.e = "<"
        self.source = window.source
        self.item_type = ""  # item type of the last top-level array read
        self.keep_budget = MAX_KEPT_ITEMS  # array items kept as Python values, over the whole header

    def fail(self, message: str) -> HeaderError:
        return HeaderError(message, path=self.source)

    def take(self, n: int, want: int = 0) -> int:
        start = self.pos
        self.w.ensure(start + n, want)
        self.pos = start + n
        return start

    def num(self, code: str, size: int) -> Any:
        at = self.take(size)
        return struct.unpack_from(self.e + code, self.w.data, at)[0]

    def u32(self) -> int:
        return self.num("I", 4)

    def u64(self) -> int:
        return self.num("Q", 8)

    def string(self, what: str, cap: int, want: int = 0, *, strict: bool = True) -> str:
        """A u64-length string. Keys and tensor names must be UTF-8 (they are matched exactly); values are
        decoded with replacement, as llama.cpp's reader does not validate them either."""
        length = self.u64()
        if length > cap:
            raise self.fail(f"{what} is {length:,} bytes long, over the {cap:,}-byte cap")
        at = self.take(length, want)
        raw = bytes(self.w.data[at:at + length])
        try:
            return raw.decode("utf-8", "strict" if strict else "replace")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {at:,} is not valid UTF-8") from None

    def value(self, vtype: int, key: str, depth: int) -> Any:
        spec = VALUE_TYPES.get(vtype)
        if spec is None:
            raise self.fail(f"key '{key}' has unknown value type {vtype}")
        name, code, size = spec
        if vtype == STRING:
            return self.string(f"the value of '{key}'", MAX_STRING_BYTES, strict=False)
        if vtype == ARRAY:
            return self.array(key, depth + 1)
        return self.num(code, size)

    def array(self, key: str, depth: int) -> Any:
        if depth > MAX_ARRAY_DEPTH:
            raise self.fail(f"key '{key}' nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        item_type = self.u32()
        spec = VALUE_TYPES.get(item_type)
        if spec is None:
            raise self.fail(f"array '{key}' has unknown item type {item_type}")
        name, code, size = spec
        if depth == 1:
            self.item_type = name
        count = self.u64()
        if count * size > self.w.cap - self.pos:
            raise self.fail(f"array '{key}' claims {count:,} items, more than the "
                            f"{max(self.w.cap - self.pos, 0):,} bytes that can follow")
        if item_type not in (STRING, ARRAY):
            at = self.take(count * size)
            if not self._keep(count):
                return GgufArray(name, count)
            return tuple(struct.unpack_from(f"{self.e}{count}{code}", self.w.data, at))
        keep = self._keep(count)
        if item_type == STRING and not keep:
            self._skip_strings(key, count)
            return GgufArray("STRING", count)
        items: list[Any] = []
        start = self.pos
        for i in range(count):
            if item_type == STRING:
                # Size the next read from the mean item so far (the Hub reads ranges this way).
                mean = (self.pos - start) / i if i else 16
                length = self.u64()
                if length > MAX_STRING_BYTES:
                    raise self.fail(f"item {i} of array '{key}' is {length:,} bytes long, over the cap")
                want = self.pos + int((count - i) * mean * 1.02) + 1024
                at = self.take(length, want)
                if keep:
                    items.append(bytes(self.w.data[at:at + length]).decode("utf-8", "replace"))
            else:
                value = self.array(key, depth + 1)
                if keep:
                    items.append(value)
        if not keep:
            return GgufArray("STRING" if item_type == STRING else "ARRAY", count)
        return tuple(items)


    def _keep(self, count: int) -> bool:
        """Whether an array of ``count`` items is kept as values (short, and within the header's budget:
        nested arrays of short arrays could otherwise build millions of Python objects)."""
        if count > MAX_KEPT_ARRAY or count > self.keep_budget:
            return False
        self.keep_budget -= count
        return True

    def _skip_strings(self, key: str, count: int) -> None:
        """Walk ``count`` strings without decoding them (a tokenizer's 150k-600k tokens, in one tight loop).

        Runs over the bytes already in the window; when they run out, asks for more sized from the mean
        string so far (the Hub reads ranges this way) and goes on from where it stopped.
        """
        unpack = struct.Struct(self.e + "Q").unpack_from
        pos, start, i = self.pos, self.pos, 0
        while i < count:
            data = self.w.data
            have = len(data)
            while i < count and pos + 8 <= have:
                (length,) = unpack(data, pos)
                if length > MAX_STRING_BYTES:
                    raise self.fail(f"item {i} of array '{key}' is {length:,} bytes long, over the cap")
                if pos + 8 + length > have:
                    break
                pos += 8 + length
                i += 1
            if i == count:
                break
            mean = (pos - start) / i if i else 16
            need = pos + 8 + (unpack(data, pos)[0] if pos + 8 <= have else 0)
            self.w.ensure(need, pos + int((count - i) * mean * 1.02) + 1024)
        self.pos = pos


def parse_gguf(window: ByteWindow) -> GgufHeader:
    """Parse and validate one GGUF header. Raises HeaderError (one line naming the file)."""
    p = _Parser(window)
    window.ensure(4, 16 << 10)
    if bytes(window.data[:4]) != MAGIC:
        raise p.fail("not a GGUF file (no GGUF magic)")
    p.pos = 4
    version = p.u32()
    big_endian = False
    if version & 0xFFFF == 0 and version >> 16:
        big_endian, p.e = True, ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in (2, 3):
        raise p.fail(f"unsupported GGUF version {version} (2 and 3 are read)")
    n_tensors, n_kv = p.u64(), p.u64()
    if n_tensors > MAX_TENSORS:
        raise p.fail(f"claims {n_tensors:,} tensors, over the {MAX_TENSORS:,} cap")
    if n_kv > MAX_KV:
        raise p.fail(f"claims {n_kv:,} metadata keys, over the {MAX_KV:,} cap")
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for _ in range(n_kv):
        key = p.string("a metadata key", MAX_KEY_BYTES)
        if key in metadata:
            raise p.fail(f"metadata key '{key}' appears twice")
        vtype = p.u32()
        metadata[key] = p.value(vtype, key, 0)
        types[key] = _type_name(vtype, p)
    alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if types.get(ALIGNMENT_KEY, "UINT32") != "UINT32" or not isinstance(alignment, int) \
            or alignment <= 0 or alignment & (alignment - 1):
        raise p.fail(f"general.alignment must be a power-of-two UINT32, got {alignment!r}")
    tensors = _tensor_infos(p, n_tensors)
    header_bytes = -(-p.pos // alignment) * alignment
    data_bytes = _check_layout(p, tensors, alignment, header_bytes)
    return GgufHeader(version=version, big_endian=big_endian, metadata=metadata, value_types=types,
                      tensors=tensors, alignment=alignment, header_bytes=header_bytes, data_bytes=data_bytes,
                      file_size=window.file_size)


def _type_name(vtype: int, p: _Parser) -> str:
    return VALUE_TYPES[vtype][0] if vtype != ARRAY else f"ARRAY[{p.item_type}]"


def _tensor_infos(p: _Parser, count: int) -> tuple[GgufTensorInfo, ...]:
    infos: list[GgufTensorInfo] = []
    names: set[str] = set()
    start = p.pos
    for i in range(count):
        mean = (p.pos - start) / i if i else 64
        want = p.pos + int((count - i) * mean * 1.02) + 512
        name = p.string(f"the name of tensor {i}", MAX_KEY_BYTES, want)
        if name in names:
            raise p.fail(f"tensor '{name}' appears twice")
        names.add(name)
        n_dims = p.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise p.fail(f"tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} are valid)")
        at = p.take(8 * n_dims)
        shape = struct.unpack_from(f"{p.e}{n_dims}Q", p.w.data, at)
        type_id = p.u32()
        ggml = GGML_TYPES.get(type_id)
        if ggml is None:
            raise p.fail(f"tensor '{name}' has unknown ggml type {type_id}")
        offset = p.u64()
        elements = prod(shape)
        if elements >= 1 << 63:
            raise p.fail(f"tensor '{name}' shape {list(shape)} overflows 64 bits")
        if shape[0] % ggml.block_size:
            raise p.fail(f"tensor '{name}' row of {shape[0]} elements is not a multiple of the "
                         f"{ggml.name} block ({ggml.block_size})")
        infos.append(GgufTensorInfo(name, tuple(shape), ggml.name, offset, ggml.nbytes(elements), elements))
    return tuple(infos)


def _check_layout(p: _Parser, tensors: tuple[GgufTensorInfo, ...], alignment: int, header_bytes: int) -> int:
    """Offsets aligned, no two tensors overlapping, and every tensor inside the file when its size is known."""
    end = 0
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.offset % alignment:
            raise p.fail(f"tensor '{t.name}' offset {t.offset:,} is not a multiple of the alignment {alignment}")
        if t.offset < end:
            raise p.fail(f"tensor '{t.name}' overlaps the tensor before it (offset {t.offset:,} < {end:,})")
        end = t.offset + t.nbytes
    size = p.w.file_size
    if size is not None and header_bytes + end > size and tensors:
        raise p.fail(f"tensor data ends at byte {header_bytes + end:,}, past the end of the "
                     f"{size:,}-byte file (truncated?)")
    return end
