"""How many bytes to ask for first when reading a safetensors header over HTTP ranges (pure functions).

From the index (the usual case): a header holds each tensor name of the shard once (the index lists them)
plus a JSON entry of nearly constant size. The first requests (one per worker) ask for a generous guess of
that size; each header that arrives measures it, and every later request asks for what the largest
measurement predicts plus a small margin. No shard is read ahead of the others to measure it first: that
cost one round trip more before the rest could start. A prediction that falls short costs one more GET,
for the remainder only. huggingface_hub's ``get_safetensors_metadata`` asks every shard for
``bytes=0-100000`` and needs a second GET for every header over 99,992 bytes (hf_api.py
``parse_safetensors_file_metadata``); per-expert NVFP4 / FP8 MoE shards are far above that.
"""

from __future__ import annotations

from typing import Mapping

from ckptinspect.header.parser import MAX_HEADER_LENGTH as MAX_HEADER_LENGTH  # re-exported (see below)
from ckptinspect.records import IndexSummary

# The same cap as a local read (header/parser.py, the safetensors reference reader's 100,000,000 bytes):
# one checkpoint is accepted or refused alike locally, from a snapshot and over the Hub, with the same
# message (main refused above 25,000,000 over the Hub, huggingface_hub's SAFETENSORS_MAX_HEADER_LENGTH).
# Checked on the 8-byte prefix, before any header byte beyond the first range is requested; the bytes
# fetched stay within the read's budget (CKPTINSPECT_MAX_BYTES).
# (MAX_HEADER_LENGTH is imported above; the Hub reader and the header cache take it from here.)

# Used when no index names the shard's tensors (single-file repos); covers a 7B dense model's header.
DEFAULT_FIRST_RANGE = 131_072
# First-guess bytes per header entry beyond the tensor name. An entry is
# `"<name>":{"dtype":"BF16","shape":[7168,2048],"data_offsets":[1234567890,1249247938]},`: 70-90 bytes
# besides the name for 2-D tensors in multi-GB shards; 100 covers long dtypes and 4-D shapes, so the
# first requests nearly always need no second one.
FIRST_ENTRY_GUESS = 100
# Margin over the largest per-entry size measured so far: offsets grow by a digit between shards at most,
# and shapes differ by a few digits. Measured on the 94-shard Qwen3.5-397B NVFP4 replica: BENCHMARKS.md
# (0 second requests, total bytes within 1.05x of the exact header bytes).
ENTRY_MARGIN = 3
FIXED_SLACK = 256  # __metadata__ ({"format":"pt"}) and the writer's padding to a multiple of 8


class RangeSizer:
    """First-range sizes for the shards of one checkpoint, learning the entry size from each header read."""

    def __init__(self, summary: IndexSummary | None) -> None:
        self.counts: Mapping[str, int] = summary.counts if summary is not None else {}
        self.name_bytes: Mapping[str, int] = summary.name_bytes if summary is not None else {}
        self.entry_size: float | None = None  # largest measured bytes per entry beyond the name

    def first_range(self, shard: str, size: int | None) -> int:
        """Bytes to ask for first, the 8-byte length prefix included (never past the file's end)."""
        count = self.counts.get(shard)
        if count:
            per_entry = FIRST_ENTRY_GUESS if self.entry_size is None else self.entry_size + ENTRY_MARGIN
            want = 8 + int(self.name_bytes[shard] + count * per_entry) + FIXED_SLACK
        else:
            want = DEFAULT_FIRST_RANGE
        return min(want, size) if size is not None else want

    def learn(self, shard: str, length: int) -> None:
        count = self.counts.get(shard)
        if count:
            measured = (length - self.name_bytes[shard]) / count
            self.entry_size = measured if self.entry_size is None else max(self.entry_size, measured)
