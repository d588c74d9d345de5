"""Time and byte limits for every Hub request, and for the whole Hub read of one command.

A read timeout alone bounds only the wait for the *next* packet: a server that answers one byte per
second keeps a request alive for ever. So each request also has a deadline for the whole exchange
(connect, redirects, headers, body: ``asyncio.timeout`` in sources/hub_client.py), and the whole command
has a deadline and a byte budget that every request (the repo info, the small JSON files, every header
range, error bodies) draws from.

Defaults and the environment variables that change them (``ckptinspect --deadline`` and
``--request-timeout`` set the two deadlines; docs/security.md lists every limit):

- CKPTINSPECT_CONNECT_TIMEOUT_S: TCP connect + TLS handshake, 10 s;
- HF_HUB_DOWNLOAD_TIMEOUT: one socket read (the first byte of an answer, each read after it), 10 s;
- CKPTINSPECT_REQUEST_TIMEOUT_S: one request's whole answer, 60 s;
- CKPTINSPECT_DEADLINE_S: every Hub request of the command together, 300 s;
- CKPTINSPECT_MAX_BYTES: body bytes received by the command, all requests together, 2 GiB;
- CKPTINSPECT_RETRY_WAIT_S: backoff and Retry-After waits of one request together, 30 s.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from ckptinspect.errors import NetworkError

CONNECT_ENV = "CKPTINSPECT_CONNECT_TIMEOUT_S"
READ_ENV = "HF_HUB_DOWNLOAD_TIMEOUT"  # huggingface_hub's own knob for the same thing
REQUEST_ENV = "CKPTINSPECT_REQUEST_TIMEOUT_S"
DEADLINE_ENV = "CKPTINSPECT_DEADLINE_S"
MAX_BYTES_ENV = "CKPTINSPECT_MAX_BYTES"
RETRY_WAIT_ENV = "CKPTINSPECT_RETRY_WAIT_S"

DEFAULT_CONNECT_S = 10.0
DEFAULT_READ_S = 10.0  # huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT default
DEFAULT_REQUEST_S = 60.0  # the largest header (25 MB) at ~0.5 MB/s
DEFAULT_DEADLINE_S = 300.0
# A 400k-tensor checkpoint reads ~52 MB of headers and a ~45 MB index; 2 GiB leaves room for a
# 256 MiB index (the largest per-file cap) and retries, and stops a server that streams without end.
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
DEFAULT_RETRY_WAIT_S = 30.0


def _env_number(name: str, default: float, *, integer: bool = False) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise NetworkError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise NetworkError(f"{name}={raw!r} must be greater than 0")
    return value


@dataclass(frozen=True)
class NetLimits:
    connect_s: float = DEFAULT_CONNECT_S
    read_s: float = DEFAULT_READ_S
    request_s: float = DEFAULT_REQUEST_S
    deadline_s: float = DEFAULT_DEADLINE_S
    max_bytes: int = DEFAULT_MAX_BYTES
    retry_wait_s: float = DEFAULT_RETRY_WAIT_S

    @classmethod
    def from_env(cls, read_s: float | None = None) -> "NetLimits":
        """The limits the environment sets now (read at call time, so tests and the CLI flags can set them)."""
        return cls(
            connect_s=_env_number(CONNECT_ENV, DEFAULT_CONNECT_S),
            read_s=read_s if read_s is not None else _env_number(READ_ENV, DEFAULT_READ_S),
            request_s=_env_number(REQUEST_ENV, DEFAULT_REQUEST_S),
            deadline_s=_env_number(DEADLINE_ENV, DEFAULT_DEADLINE_S),
            max_bytes=int(_env_number(MAX_BYTES_ENV, DEFAULT_MAX_BYTES, integer=True)),
            retry_wait_s=_env_number(RETRY_WAIT_ENV, DEFAULT_RETRY_WAIT_S),
        )


class Budget:
    """What is left of one command's deadline and byte budget; shared by all its threads.

    ``ends_at`` is a ``time.monotonic()`` value.
    """

    def __init__(self, limits: NetLimits, *, ends_at: float | None = None, max_bytes: int | None = None) -> None:
        self.limits = limits
        self.ends_at = ends_at if ends_at is not None else time.monotonic() + limits.deadline_s
        self.max_bytes = max_bytes if max_bytes is not None else limits.max_bytes
        self.received = 0
        self._lock = threading.Lock()

    def left_s(self) -> float:
        return self.ends_at - time.monotonic()

    def check_time(self, where: str) -> None:
        if self.left_s() <= 0:
            raise self.deadline_error(where)

    def deadline_error(self, where: str) -> NetworkError:
        return NetworkError(f"the Hub read did not finish within its {self.limits.deadline_s:g} s deadline",
                            path=where, hint=f"raise it with --deadline or {DEADLINE_ENV}")

    def take(self, nbytes: int, where: str) -> None:
        """Count ``nbytes`` received; raise once the command has received more than its budget."""
        with self._lock:
            self.received += nbytes
            over = self.received > self.max_bytes
        if over:
            raise NetworkError(f"received more than the {self.max_bytes:,} byte budget of this command "
                               "(a server that ignores ranges or streams without end?)",
                               path=where, hint=f"raise it with {MAX_BYTES_ENV}")
