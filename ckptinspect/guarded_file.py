"""The one reader for every file ckptinspect reads besides the checkpoint's own: the HF cache's
``refs/<revision>``, ``--probe-report``, ``--gpu-spec``, the probe's prompts, corpus, tokenizer files
and chat template.

Each such path is user- or attacker-chosen, so it gets what the checkpoint files get: a regular file
only (stat before opening, so a FIFO never blocks the open; fstat after, O_NONBLOCK in between, so a
path swapped for a FIFO or a device cannot hang or stream ``/dev/zero``), a size cap checked before
anything is read (a sparse 4 GB file costs nothing), at most cap + 1 bytes read, JSON through the one
bounded decoder (integer digits, nesting depth: no RecursionError), and every failure one error line
of the caller's error class naming the file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from ckptinspect.errors import CkptInspectError

KIB, MIB = 1024, 1024 * 1024
# Caps per kind of file (the largest real one, with room): docs/security.md lists them.
MAX_REF_BYTES = 1 * KIB  # refs/<revision>: a 40-hex commit and a newline
MAX_PROBE_REPORT_BYTES = 16 * MIB  # a probe JSON with per-prompt rows is ~1 MB
MAX_GPU_SPEC_BYTES = 1 * MIB  # a user GPU catalog (the built-in one is ~10 KB)
MAX_TOKENIZER_BYTES = 64 * MIB  # tokenizer.json of 256k-vocab models is ~20-35 MB
MAX_TEMPLATE_BYTES = 1 * MIB  # chat templates are a few KB; the largest known ~60 KB
MAX_PROMPTS_BYTES = 64 * MIB  # --prompts / --corpus text


class NotRegularFile(Exception):
    """``open_regular_file`` found something other than a regular file (before or after opening)."""


def open_regular_file(path: str | Path) -> tuple[int, int]:
    """(read-only descriptor, size) of ``path`` if it is a regular file; the caller closes it.

    stat() before opening (opening a FIFO for reading blocks until a writer appears, and opening a
    device can have side effects), fstat() on the opened descriptor (the path may have been swapped in
    between; O_NONBLOCK keeps even that open from blocking). The one copy of this sequence: the
    checkpoint sources (sources/interface.py ``open_regular``) and ``read_bytes`` word its failures.

    Raises:
        NotRegularFile; FileNotFoundError when missing; the OSError of stat, open or fstat otherwise.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotRegularFile
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_bytes(path: str | Path, *, what: str, cap: int,
               error: type[CkptInspectError] = CkptInspectError) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``cap`` bytes; else ``error``."""
    source = str(path)
    try:
        fd, size = open_regular_file(path)
    except NotRegularFile:
        raise error(f"{what} is not a regular file", path=source) from None
    except FileNotFoundError:
        raise error(f"{what} does not exist", path=source) from None
    except OSError as exc:
        raise error(_os_problem(exc, what), path=source) from None
    try:
        if size > cap:
            raise error(f"{what} is {size:,} bytes, over the {cap:,}-byte cap", path=source)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(cap + 1)
    except OSError as exc:
        raise error(_os_problem(exc, what), path=source) from None
    finally:
        os.close(fd)
    if len(data) > cap:  # grew after the stat
        raise error(f"{what} is over the {cap:,}-byte cap", path=source)
    return data


def read_text(path: str | Path, *, what: str, cap: int, error: type[CkptInspectError] = CkptInspectError) -> str:
    """``read_bytes`` decoded as UTF-8 (invalid UTF-8 is ``error``)."""
    data = read_bytes(path, what=what, cap=cap, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not valid UTF-8 (byte {exc.start})", path=str(path)) from None


def read_json(path: str | Path, *, what: str, cap: int, error: type[CkptInspectError] = CkptInspectError) -> Any:
    """``read_bytes`` decoded by the bounded JSON decoder (json_text.py)."""
    from ckptinspect.json_text import decode_json

    data = read_bytes(path, what=what, cap=cap, error=error)
    return decode_json(data, source=str(path), error=error, what=what)


def _os_problem(exc: OSError, what: str) -> str:
    if exc.errno == errno.ELOOP:
        return f"{what} is a symlink loop"
    return f"cannot read {what} ({exc.strerror or exc})"
