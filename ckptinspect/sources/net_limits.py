"""Time and byte limits for every remote request (the Hub, GGUF ranges, the audit's listing, the probe's
inference servers: all through sources/hub_client.py), and for all the requests of one command.

A read timeout alone bounds only the wait for the *next* packet: a server that answers one byte per
second keeps a request alive for ever. So each request also has a deadline for the whole exchange
(connect, redirects, headers, body: ``asyncio.timeout`` in sources/hub_client.py), and the whole command
has a deadline and a byte budget that every request (the repo info, the small JSON files, every header
range, error bodies) draws from.

The limits come from the command's settings (ckptinspect/settings.py: ``--deadline`` and
``--request-timeout`` set the two deadlines, the environment variables below the rest; docs/security.md
lists every limit). Defaults and the variables that change them:

- CKPTINSPECT_CONNECT_TIMEOUT_S: TCP connect + TLS handshake, 10 s;
- HF_HUB_DOWNLOAD_TIMEOUT: one socket read (the first byte of an answer, each read after it), 10 s;
- CKPTINSPECT_REQUEST_TIMEOUT_S: one request's whole answer, 60 s;
- CKPTINSPECT_DEADLINE_S: every Hub request of the command together, 300 s;
- CKPTINSPECT_MAX_BYTES: body bytes received by the command, all requests together, 2 GiB;
- CKPTINSPECT_RETRY_WAIT_S: backoff and Retry-After waits of one request together, 30 s.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ckptinspect.errors import NetworkError
from ckptinspect.settings import DEFAULTS, Settings

CONNECT_ENV = "CKPTINSPECT_CONNECT_TIMEOUT_S"
READ_ENV = "HF_HUB_DOWNLOAD_TIMEOUT"  # huggingface_hub's own knob for the same thing
REQUEST_ENV = "CKPTINSPECT_REQUEST_TIMEOUT_S"
DEADLINE_ENV = "CKPTINSPECT_DEADLINE_S"
MAX_BYTES_ENV = "CKPTINSPECT_MAX_BYTES"
RETRY_WAIT_ENV = "CKPTINSPECT_RETRY_WAIT_S"

DEFAULT_CONNECT_S = DEFAULTS.connect_timeout_s
DEFAULT_READ_S = DEFAULTS.read_timeout_s  # huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT default
DEFAULT_REQUEST_S = DEFAULTS.request_timeout_s  # the largest header (25 MB) at ~0.5 MB/s
DEFAULT_DEADLINE_S = DEFAULTS.deadline_s
# A 400k-tensor checkpoint reads ~52 MB of headers and a ~45 MB index; 2 GiB leaves room for a
# 256 MiB index (the largest per-file cap) and retries, and stops a server that streams without end.
DEFAULT_MAX_BYTES = DEFAULTS.max_bytes
DEFAULT_RETRY_WAIT_S = DEFAULTS.retry_wait_s


@dataclass(frozen=True)
class NetLimits:
    connect_s: float = DEFAULT_CONNECT_S
    read_s: float = DEFAULT_READ_S
    request_s: float = DEFAULT_REQUEST_S
    deadline_s: float = DEFAULT_DEADLINE_S
    max_bytes: int = DEFAULT_MAX_BYTES
    retry_wait_s: float = DEFAULT_RETRY_WAIT_S

    @classmethod
    def from_settings(cls, settings: Settings = DEFAULTS, read_s: float | None = None) -> "NetLimits":
        """The limits ``settings`` give (``read_s``: a caller's own socket-read timeout instead)."""
        return cls(connect_s=settings.connect_timeout_s,
                   read_s=read_s if read_s is not None else settings.read_timeout_s,
                   request_s=settings.request_timeout_s, deadline_s=settings.deadline_s,
                   max_bytes=settings.max_bytes, retry_wait_s=settings.retry_wait_s)


class Budget:
    """What is left of one command's deadline and byte budget; shared by all its requests.

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
        return NetworkError(f"the network read did not finish within its {self.limits.deadline_s:g} s deadline",
                            path=where, hint=f"raise it with --deadline or {DEADLINE_ENV}")

    def reserve(self, nbytes: int, where: str) -> None:
        """Raise before a request that asks for more bytes than the budget has left."""
        if self.received + nbytes > self.max_bytes:
            raise self.budget_error(where, f"asking for {nbytes:,} more bytes would pass")

    def budget_error(self, where: str, what: str = "received more than") -> NetworkError:
        return NetworkError(f"{what} the {self.max_bytes:,} byte budget of this command "
                            "(a server that ignores ranges, streams without end, or lists too many files?)",
                            path=where, hint=f"raise it with {MAX_BYTES_ENV}")

    def take(self, nbytes: int, where: str) -> None:
        """Count ``nbytes`` received; raise once the command has received more than its budget."""
        with self._lock:
            self.received += nbytes
            over = self.received > self.max_bytes
        if over:
            raise self.budget_error(where)
