"""Range GETs of safetensors headers on the Hub, each first range sized so that one request nearly
always holds the whole header.

From the index (the usual case): a header holds each tensor name of the shard once (the index lists
them) plus a JSON entry of nearly constant size, so one shard is read first to measure that entry size,
and the rest are asked for exactly what they need plus a small margin.

Before the index (speculative reads): the index of a large checkpoint is tens of MB and takes its
reader (sources/index_prefetch.py) a few tenths of a second to fetch and parse, while the repo info,
which lists every file with its size, is in already. When the repo's top-level files form one complete
``{prefix}-{i}-of-{n}.safetensors`` set (what ``save_pretrained`` writes, and what the index then names),
the headers of those of typical file size are read at once, sized from the file size for the first one
and from the longest header read so far for the others (the rest wait for the index). The index stays the authority: its shard list decides which headers count
(one it names that was not read is read then; a file read that it does not name is dropped, its errors
included), and the report cross-checks every header against it (pipeline ``_index_findings``).

A prediction that falls short costs one more GET for the remainder only.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from typing import Any, Callable, Iterable, Mapping

from ckptinspect.errors import HeaderError
from ckptinspect.header.parser import read_length_prefix
from ckptinspect.records import IndexSummary
from ckptinspect.sources.http_ranges import RangeClient

# huggingface_hub SAFETENSORS_MAX_HEADER_LENGTH and huggingface.js MAX_HEADER_LENGTH: checked on the
# 8-byte prefix, before any header byte beyond the first range is requested.
MAX_HEADER_LENGTH = 25_000_000
# Used when no index names the shard's tensors (single-file repos); covers a 7B dense model's header.
DEFAULT_FIRST_RANGE = 131_072
# First-guess bytes per header entry beyond the tensor name. An entry is
# `"<name>":{"dtype":"BF16","shape":[7168,2048],"data_offsets":[1234567890,1249247938]},`: 70-90 bytes
# besides the name for 2-D tensors in multi-GB shards; 100 covers long dtypes and 4-D shapes, so the
# calibration shard nearly always needs one request.
FIRST_ENTRY_GUESS = 100
# Margin over the largest per-entry size measured so far: offsets grow by a digit between shards at most,
# and shapes differ by a few digits. Measured on the 94-shard Qwen3.5-397B NVFP4 replica: see
# BENCHMARKS.md section 2 (0 second requests, total bytes within 1.05x of the exact header bytes).
ENTRY_MARGIN = 3
FIXED_SLACK = 256  # __metadata__ ({"format":"pt"}) and the writer's padding to a multiple of 8
# Speculative reads. The first one is sized from its file: MoE shards of a few GB carry 50-700 kB of
# header, ~1/4000 of the data (sources/local.py); 1/3000 leaves room. The others ask for the longest
# header read so far plus 2%: the shards of one checkpoint hold similar tensor counts (on the Qwen3.5-397B
# replica 92 of 94 headers lie within 1% of each other).
SPECULATIVE_BYTES_PER_DATA_BYTE = 1 / 3000
SPECULATIVE_MARGIN = 0.02
TYPICAL_SIZE_FACTOR = 1.5
EARLY_ENV = "CKPTINSPECT_EARLY_HEADERS"  # "0": no header read before the index is in
_SHARD_FILE = re.compile(r"(.+)-([0-9]+)-of-([0-9]+)\.safetensors")


def early_reads_enabled() -> bool:
    return os.environ.get(EARLY_ENV, "1").strip() != "0"


def shard_set(files: Iterable[str]) -> list[str]:
    """The top-level files named like one complete set of shards (one prefix, one count n, every index
    1..n exactly once), sorted; [] when the names do not form exactly one such set."""
    found: dict[tuple[str, int], list[int]] = {}
    names: list[str] = []
    for name in files:
        match = _SHARD_FILE.fullmatch(name) if "/" not in name else None
        if match is not None:
            found.setdefault((match.group(1), int(match.group(3))), []).append(int(match.group(2)))
            names.append(name)
    if len(found) != 1:
        return []
    (_, count), indices = next(iter(found.items()))
    return sorted(names) if sorted(indices) == list(range(1, count + 1)) else []


def typical_size(names: list[str], sizes: Mapping[str, int | None]) -> list[str]:
    """The files whose size is within TYPICAL_SIZE_FACTOR of the median size (all of them when a size is
    unknown): their headers are the ones the longest header read so far predicts well. A much larger
    file (the one holding embeddings, the output head, an MTP layer) tends to have a longer header, a
    much smaller one a shorter header: both are read once the index can size them."""
    known = sorted(sizes.get(n) or 0 for n in names)
    if not known or known[0] <= 0:
        return list(names)
    median = known[len(known) // 2]
    return [n for n in names if median / TYPICAL_SIZE_FACTOR <= (sizes.get(n) or 0) <= median * TYPICAL_SIZE_FACTOR]


class HeaderReader:
    """Reads shard headers over ``client``: ``start`` requests, ``collect`` the answers."""

    def __init__(self, client: RangeClient, summary: IndexSummary | None,
                 on_header: Callable[[str, bytes], None] | None = None) -> None:
        self.client = client
        self.on_header = on_header
        self.counts: Mapping[str, int] = {}
        self.name_bytes: Mapping[str, int] = {}
        self.entry_size: float | None = None  # largest measured bytes per entry beyond the name
        self.lengths: dict[str, int] = {}  # header lengths read so far
        self.lock = threading.Lock()
        if summary is not None:
            self.use_index(summary)

    def use_index(self, summary: IndexSummary) -> None:
        """Size the reads from now on from the index (also learning from the headers already read)."""
        with self.lock:
            self.counts, self.name_bytes = summary.counts, summary.name_bytes
            lengths = dict(self.lengths)
        for shard, n in lengths.items():
            self.learn(shard, n)

    def predict(self, shard: str, size: int | None, speculative: bool) -> int:
        """Header bytes to ask for (without the 8-byte prefix)."""
        count = self.counts.get(shard)
        with self.lock:
            per_entry = FIRST_ENTRY_GUESS if self.entry_size is None else self.entry_size + ENTRY_MARGIN
            longest = max(self.lengths.values(), default=0)
        if count:
            return int(self.name_bytes[shard] + count * per_entry) + FIXED_SLACK
        if not speculative:
            return DEFAULT_FIRST_RANGE - 8
        if longest:
            return int(longest * (1 + SPECULATIVE_MARGIN)) + FIXED_SLACK
        guess = int((size or 0) * SPECULATIVE_BYTES_PER_DATA_BYTE)
        return min(max(guess, DEFAULT_FIRST_RANGE - 8), MAX_HEADER_LENGTH)

    def learn(self, shard: str, n: int) -> None:
        with self.lock:
            self.lengths[shard] = n
            count = self.counts.get(shard)
            if count:
                measured = (n - self.name_bytes[shard]) / count
                self.entry_size = measured if self.entry_size is None else max(self.entry_size, measured)

    def start(self, pool: ThreadPoolExecutor, shards: list[str], url: Callable[[str], str],
              sizes: Mapping[str, int | None], *, speculative: bool = False) -> dict[Future, str]:
        """Request every header of ``shards``; returns future -> shard. Unless something was measured
        already, one typical shard (median tensor count, or file size before the index) is read first and
        the rest only after it. Not speculative: a failure of that first read raises here."""
        futures: dict[Future, str] = {}
        if not shards:
            return futures
        with self.lock:
            measured = self.entry_size is not None or (speculative and bool(self.lengths))
        first = None
        if not measured:
            key = (lambda s: sizes.get(s) or 0) if speculative else (lambda s: self.counts.get(s, 0))
            first = sorted(shards, key=key)[len(shards) // 2]
            calibration = pool.submit(self.read_one, first, url(first), sizes.get(first), speculative)
            wait([calibration])
            if not speculative:
                calibration.result()
            futures[calibration] = first
        for shard in shards:
            if shard != first:
                futures[pool.submit(self.read_one, shard, url(shard), sizes.get(shard), speculative)] = shard
        return futures

    def collect(self, futures: Mapping[Future, str], shards: list[str], *, progress: bool) -> dict[str, bytes]:
        """The headers of ``shards`` (in that order) from ``futures``; the futures of other files are
        cancelled and their answers, errors included, ignored. Fails fast on the first error."""
        from tqdm.auto import tqdm

        wanted = set(shards)
        for fut, shard in futures.items():
            if shard not in wanted:
                fut.cancel()
        mine = {fut: shard for fut, shard in futures.items() if shard in wanted}
        out: dict[str, bytes] = {}
        # No monitor thread (tqdm starts one even for a disabled bar): a later Hub read in this process
        # forks its index reader only while single-threaded (sources/index_prefetch.py).
        tqdm.monitor_interval = 0
        bar = tqdm(total=len(shards), desc="Reading headers", unit="shard", file=sys.stderr,
                   disable=not progress, leave=False)
        try:
            for fut in as_completed(mine):
                out[mine[fut]] = fut.result()
                bar.update(1)
        except BaseException:
            cancel(futures)  # fail fast: do not start the remaining requests
            raise
        finally:
            bar.close()
        return {s: out[s] for s in shards}

    def read_one(self, shard: str, url: str, size: int | None, speculative: bool = False) -> bytes:
        where = f"{self.client.repo_id}/{shard}"
        want = 8 + self.predict(shard, size, speculative)
        if size is not None:
            if size < 8:
                raise HeaderError(f"file is {size} bytes, too small for a safetensors header", path=where)
            want = min(want, size)
        body = self.client.get(url, shard, 0, want - 1)
        if len(body) < 8:  # a short 206 that did not even cover the length prefix
            body += self.client.rest(url, shard, len(body), 8)
        n = read_length_prefix(body[:8], source=where, file_size=size, max_length=MAX_HEADER_LENGTH)
        have = len(body) - 8  # ranges are inclusive: the header is complete iff n <= len(body) - 8
        if n > have:
            body += self.client.rest(url, shard, len(body), 8 + n)
        self.learn(shard, n)
        header = body[8:8 + n]
        if self.on_header is not None:
            self.on_header(shard, header)
        return header


def cancel(futures: Iterable[Future]) -> None:
    """Cancel the requests not started yet (the running ones finish; the pool waits for them)."""
    for fut in futures:
        fut.cancel()
