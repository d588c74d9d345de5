"""Fail fast when the Hub cannot be reached, and keep huggingface_hub's retry chatter off the terminal.

The audit's listing and commit checks are huggingface_hub's own calls (``HfApi.list_models``,
``model_info``), which retry a refused connection five times with backoff and log a "Retrying in Ns"
line each time: without network an audit printed six such lines over 27 s, where `report` gives one
error line in 4 s. One short request first (as few attempts as `report`'s client makes) tells an
unreachable endpoint from a slow one; the library's retry warnings are silenced while its calls run
(their outcome is the command's one line).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

from ckptinspect.errors import NetworkError

ATTEMPTS = 3  # as the Hub reader: a refused connection is retried briefly, then it is the answer
BACKOFF_S = 0.5


def check_reachable(endpoint: str, *, timeout_s: float) -> None:
    """NetworkError (one line) when nothing answers at ``endpoint`` after ``ATTEMPTS`` quick tries."""
    from ckptinspect.sources.hub_client import httpx_module  # huggingface_hub's own HTTP library

    httpx = httpx_module()
    last: Exception | None = None
    for attempt in range(ATTEMPTS):
        try:
            with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
                client.head(endpoint.rstrip("/") + "/api/models", params={"limit": 1})
            return
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            last = exc
        except httpx.HTTPError:
            return  # it answered something: the listing call says what
        time.sleep(BACKOFF_S * (attempt + 1))
    raise NetworkError(f"cannot reach the Hub at {endpoint} ({type(last).__name__}: {last}; gave up after "
                       f"{ATTEMPTS} attempts)")


@contextmanager
def quiet_hub_retries() -> Iterator[None]:
    """huggingface_hub's own "Retrying in Ns" warnings off while its calls run."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
