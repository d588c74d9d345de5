"""Run many repos' reports at once, on one event loop: ``jobs`` coroutines, each running exactly
`report`'s code on one repo at a time (so a row is that repo's report by construction), under one
deadline and one ``asyncio.Semaphore`` bounding the requests in flight of every repo together, each
repo's read with the byte budget `report` has.

Why one loop: a Hub read is ``asyncio`` I/O (sources/hub.py ``read_hub``), so while one repo waits on the
network the others' answers arrive; the per-repo CPU work (the stages after the source) runs between
awaits. No thread or process is started for a repo, every repo's requests draw from one semaphore
(sources/hub_client.py holds a slot per request; tests/test_audit.py measures the peak on the test Hub
server), and a repo's failure is an exception caught in its coroutine. The deadline is the command's:
every read's budget ends at it at the latest; a repo still running when it passes (plus a grace for its
own deadline error) becomes a row saying so. Closing the iterator (Ctrl-C) cancels every running read
at once: the loop's tasks are cancelled and awaited before the iterator returns.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ckptinspect.audit.cache import AuditCache, cache_root, code_fingerprint
from ckptinspect.audit.row import AuditRow, RepoError, error_row, row_from_report
from ckptinspect.audit.select import RepoRef, current_sha_async
from ckptinspect.settings import DEFAULTS, Settings

DEFAULT_JOBS = 8
DEFAULT_MAX_REQUESTS = 64
GRACE_S = 5.0  # past the deadline, how long to wait for reads to report their own deadline error


@dataclass(frozen=True)
class AuditOptions:
    """What each repo's report is asked for (as `report`'s options) and how the audit runs."""

    gpu: str | None = None
    gpus: int | None = None
    context: int | None = None
    engine: str = "both"
    rules_dirs: tuple[Path, ...] = ()
    token: str | None = None
    jobs: int = DEFAULT_JOBS
    max_requests: int = DEFAULT_MAX_REQUESTS
    deadline_s: float | None = None  # None: settings.deadline_s (CKPTINSPECT_DEADLINE_S, --deadline)
    cache: bool = True  # and only where settings.cache_dir names a directory
    endpoint: str | None = None  # the Hub endpoint for the commit checks (ckptinspect.api.hub_endpoint)
    settings: Settings = DEFAULTS  # every repo's report runs with them (ckptinspect/settings.py)
    engine_versions: Mapping[str, str] | None = None  # the rules judge these releases (--verify-engine's installed)

    def report_options(self) -> dict[str, Any]:
        """The options that decide a report's content (the cache key holds them)."""
        out = {"gpu": self.gpu, "gpus": self.gpus, "context": self.context, "engine": self.engine}
        if self.engine_versions:  # only then: the keys of reports cached without it stay the same
            out["engine_versions"] = dict(sorted(self.engine_versions.items()))
        return out


# report_fn(repo_id, options) -> the repo's `report --format json` text, or a coroutine giving it:
# ckptinspect.api passes its own, so a row is `report`'s answer. ``options`` holds the report's options and
# the audit's ``limiter`` and ``ends_at``, for the report's network reads.
ReportFn = Callable[[str, dict], Any]


def run_audit(refs: Sequence[RepoRef], options: AuditOptions, report_fn: ReportFn) -> Iterator[AuditRow]:
    """Yield one row per ref as it finishes (cached ones first). Closing the iterator (or Ctrl-C)
    cancels the running reads; rows already yielded stay valid."""
    deadline = options.deadline_s if options.deadline_s is not None else options.settings.deadline_s
    ends_at = time.monotonic() + deadline
    cache = AuditCache(cache_root(options.settings.cache_dir) if options.cache else None,
                       code_fingerprint(options.rules_dirs),
                       options.report_options(), key_file=options.settings.cache_key_file)
    if options.max_requests < 1:
        raise ValueError("max_requests must be at least 1")
    # One loop for the whole audit; between rows it is stopped (the caller holds the row), and closing
    # the Runner cancels and awaits whatever still runs.
    with asyncio.Runner() as runner:
        audit = _Audit(options, cache, ends_at, report_fn)
        pending: list[RepoRef] = []
        runner.run(audit.cached(refs))
        for ref, doc in audit.looked:
            if doc is not None:
                yield row_from_report(ref.repo_id, doc, cached=True)
            else:
                pending.append(ref)
        if not pending:
            return
        runner.run(audit.start(pending))
        while audit.left:
            runner.run(audit.next_rows())
            yield from audit.rows


class _Audit:
    """The audit's state on its loop: the one request bound, the rows as repos finish. Each step's answer
    is kept here rather than returned by its coroutine (sources/net_edge.py ``_into`` says why)."""

    def __init__(self, options: AuditOptions, cache: AuditCache, ends_at: float, report_fn: ReportFn) -> None:
        self.options, self.cache, self.ends_at, self.report_fn = options, cache, ends_at, report_fn
        self.limiter: asyncio.Semaphore | None = None
        self.done: asyncio.Queue | None = None
        self.left: dict[str, RepoRef] = {}
        self.workers: list[asyncio.Task] = []
        self.looked: list[tuple[RepoRef, dict | None]] = []
        self.rows: list[AuditRow] = []

    async def cached(self, refs: Sequence[RepoRef]) -> None:
        """Each ref with its cached report, if any; an explicit id whose repo is in the cache is asked for
        its current commit first (its report is not read again when the commit is unchanged)."""
        self.limiter = asyncio.Semaphore(self.options.max_requests)
        if self.cache.root is None:
            self.looked = [(ref, None) for ref in refs]
            return

        async def look(ref: RepoRef) -> tuple[RepoRef, dict | None]:
            sha = ref.sha
            if sha is None and self.cache.has_repo(ref.repo_id):
                sha = await current_sha_async(ref.repo_id, token=self.options.token, endpoint=self.options.endpoint,
                                              limiter=self.limiter, ends_at=self.ends_at)
                ref = RepoRef(ref.repo_id, sha, ref.listed)
            return ref, self.cache.get(ref.repo_id, sha)

        self.looked = list(await asyncio.gather(*(look(ref) for ref in refs)))

    async def start(self, refs: list[RepoRef]) -> None:
        options = self.options
        task = {"gpu": options.gpu, "gpus": options.gpus, "context": options.context, "engine": options.engine,
                "rules_dirs": [str(d) for d in options.rules_dirs], "token": options.token,
                "limiter": self.limiter, "ends_at": self.ends_at, "settings": options.settings,
                "engine_versions": options.engine_versions}
        self.done = asyncio.Queue()
        self.left = {ref.repo_id: ref for ref in refs}
        queue = list(reversed(refs))

        async def worker() -> None:
            while queue:
                ref = queue.pop()
                out = await self._report(ref.repo_id, {**task, "listed": ref.listed})
                self.done.put_nowait((ref, out))

        self.workers = [asyncio.ensure_future(worker()) for _ in range(min(max(1, options.jobs), len(refs)))]

    async def next_rows(self) -> None:
        """The next finished repo's row; once the deadline (plus grace) passes, a row for each repo left."""
        assert self.done is not None
        try:
            async with asyncio.timeout(max(0.0, self.ends_at + GRACE_S - time.monotonic())):
                ref, out = await self.done.get()
        except TimeoutError:
            for task in self.workers:
                task.cancel()
            await asyncio.gather(*self.workers, return_exceptions=True)
            rows = []
            for repo_id in sorted(self.left):
                ref = self.left.pop(repo_id)
                rows.append(error_row(ref.repo_id, ref.sha, RepoError(
                    "NetworkError", f"{ref.repo_id}: not finished within the audit's deadline (raise it with "
                                    "--deadline or CKPTINSPECT_DEADLINE_S)")))
            self.rows = rows
            return
        self.left.pop(ref.repo_id, None)
        self.rows = [_row(ref, out, self.cache)]

    async def _report(self, repo_id: str, task: dict[str, Any]) -> tuple:
        """`report REPO --format json` on the audit's loop: ("ok", JSON text) or ("error", kind, one line)."""
        from ckptinspect.errors import CkptInspectError

        if time.monotonic() >= self.ends_at:
            return ("error", "NetworkError", f"{repo_id}: the audit's deadline passed before this repo started")
        try:
            out = self.report_fn(repo_id, task)
            if inspect.isawaitable(out):
                out = await out
            return ("ok", out)
        except CkptInspectError as exc:
            return ("error", type(exc).__name__, " ".join(str(exc).split()))
        except Exception as exc:  # noqa: BLE001 - a bug on one repo is that repo's row, never the audit's end
            return ("error", type(exc).__name__, f"{repo_id}: internal error: {' '.join(str(exc).split())[:300]}")


def _row(ref: RepoRef, out: tuple, cache: AuditCache) -> AuditRow:
    if out[0] == "ok":
        doc = json.loads(out[1])
        doc["source"].pop("stats", None)  # per-run numbers: not part of what the repo is
        cache.put(ref.repo_id, doc)
        return row_from_report(ref.repo_id, doc)
    return error_row(ref.repo_id, ref.sha, RepoError(out[1], out[2]))
