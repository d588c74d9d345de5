"""docs/security.md stays the list of every limit: each CKPTINSPECT_ variable the code reads is there, and
the defaults it states are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptinspect.sources import net_limits
from ckptinspect.sources.hub import DEFAULT_MAX_WORKERS
from ckptinspect.sources.hub_client import DEFAULT_ATTEMPTS, ERROR_BODY_LIMIT
from ckptinspect.sources.interface import MAX_INDEX_FILE_BYTES, MAX_JSON_FILE_BYTES, MAX_TOTAL_HEADER_BYTES
from ckptinspect.safe_regex import MAX_PATTERN_CHARS
from ckptinspect.safe_yaml import MAX_DEPTH, MAX_RULE_FILE_BYTES

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "security.md").read_text()


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n:,} bytes"


def test_every_environment_variable_the_code_reads_is_documented():
    used = set()
    for path in (ROOT / "ckptinspect").rglob("*.py"):
        used |= set(re.findall(r"CKPTINSPECT_[A-Z0-9_]+", path.read_text()))
    assert used and sorted(v for v in used if v not in DOC) == []


@pytest.mark.parametrize("row_key,value", [
    ("CKPTINSPECT_CONNECT_TIMEOUT_S", f"{net_limits.DEFAULT_CONNECT_S:g} s"),
    ("HF_HUB_DOWNLOAD_TIMEOUT", f"{net_limits.DEFAULT_READ_S:g} s"),
    ("CKPTINSPECT_REQUEST_TIMEOUT_S", f"{net_limits.DEFAULT_REQUEST_S:g} s"),
    ("CKPTINSPECT_DEADLINE_S", f"{net_limits.DEFAULT_DEADLINE_S:g} s"),
    ("CKPTINSPECT_MAX_BYTES", _size(net_limits.DEFAULT_MAX_BYTES)),
    ("CKPTINSPECT_RETRY_WAIT_S", f"{net_limits.DEFAULT_RETRY_WAIT_S:g} s"),
    ("CKPTINSPECT_HTTP_ATTEMPTS", f"| {DEFAULT_ATTEMPTS} |"),
    ("ERROR_BODY_LIMIT", _size(ERROR_BODY_LIMIT)),
    ("CKPTINSPECT_MAX_WORKERS", f"| {DEFAULT_MAX_WORKERS} |"),
    ("MAX_JSON_FILE_BYTES", _size(MAX_JSON_FILE_BYTES)),
    ("MAX_INDEX_FILE_BYTES", _size(MAX_INDEX_FILE_BYTES)),
    ("MAX_TOTAL_HEADER_BYTES", _size(MAX_TOTAL_HEADER_BYTES)),
    ("MAX_RULE_FILE_BYTES", _size(MAX_RULE_FILE_BYTES)),
    ("`MAX_DEPTH`", f"{MAX_DEPTH} levels"),
])
def test_documented_defaults_are_the_codes(row_key, value):
    rows = [line for line in DOC.splitlines() if row_key in line and line.startswith("|")]
    assert rows, row_key
    assert any(value in row for row in rows), (row_key, value, rows)


def test_pattern_length_cap_is_documented():
    assert f"over {MAX_PATTERN_CHARS:,} characters" in DOC
