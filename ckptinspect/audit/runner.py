"""Run many repos' reports at once: ``jobs`` threads, each running exactly `report`'s code on one repo
at a time (so a row is that repo's report by construction), under one deadline and one bound on the
requests in flight, each repo's read with the byte budget `report` has.

Why threads: a Hub read is ``asyncio`` I/O in a helper thread of its own (sources/hub.py), so while one
repo waits on the network the others parse; the per-repo CPU work takes turns on the GIL. Threads start
no process (the library must work inside daemonic pool workers, under ``spawn``, on Windows: issue 25),
share the imports and the rule cache, and a repo's failure is an exception caught in its thread.

Requests in flight: every Hub request of every repo holds a slot of one ``RequestLimiter`` of
``max_requests`` slots (sources/shared_limits.py, honoured by sources/hub_client.py); tests/test_audit.py
measures the peak on the test Hub server. The deadline is the command's: every read's budget ends at it
at the latest; a repo still running when it passes (plus a grace for its own deadline error) becomes a
row saying so, and closing the iterator (Ctrl-C) closes the limiter, so running reads stop at their
next request.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ckptinspect.audit.cache import AuditCache, cache_root, code_fingerprint
from ckptinspect.audit.row import AuditRow, RepoError, error_row, row_from_report
from ckptinspect.audit.select import RepoRef, current_sha
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

    def report_options(self) -> dict[str, Any]:
        """The options that decide a report's content (the cache key holds them)."""
        return {"gpu": self.gpu, "gpus": self.gpus, "context": self.context, "engine": self.engine}


# report_fn(repo_id, options) -> the repo's `report --format json` text: ckptinspect.api passes its own,
# so a row is `report`'s answer. Called in the audit's threads.
ReportFn = Callable[[str, dict], str]


def run_audit(refs: Sequence[RepoRef], options: AuditOptions, report_fn: ReportFn) -> Iterator[AuditRow]:
    """Yield one row per ref as it finishes (cached ones first). Closing the iterator (or Ctrl-C)
    stops the running reads at their next request; rows already yielded stay valid."""
    deadline = options.deadline_s if options.deadline_s is not None else options.settings.deadline_s
    ends_at = time.monotonic() + deadline
    cache = AuditCache(cache_root(options.settings.cache_dir) if options.cache else None,
                       code_fingerprint(options.rules_dirs),
                       options.report_options())
    if options.max_requests < 1:
        raise ValueError("max_requests must be at least 1")
    jobs = max(1, options.jobs)
    pending: list[RepoRef] = []
    for ref, doc in _cached(refs, cache, options, jobs):
        if doc is not None:
            yield row_from_report(ref.repo_id, doc, cached=True)
        else:
            pending.append(ref)
    if not pending:
        return
    yield from _run_threads(pending, options, cache, jobs, ends_at, report_fn)


def _cached(refs: Sequence[RepoRef], cache: AuditCache, options: AuditOptions,
            jobs: int) -> list[tuple[RepoRef, dict | None]]:
    """Each ref with its cached report, if any; an explicit id whose repo is in the cache is asked for
    its current commit first (its report is not read again when the commit is unchanged)."""
    if cache.root is None:
        return [(ref, None) for ref in refs]

    def look(ref: RepoRef) -> tuple[RepoRef, dict | None]:
        sha = ref.sha
        if sha is None and cache.has_repo(ref.repo_id):
            sha = current_sha(ref.repo_id, token=options.token, endpoint=options.endpoint,
                              timeout_s=options.settings.request_timeout_s)
            ref = RepoRef(ref.repo_id, sha)
        return ref, cache.get(ref.repo_id, sha)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(look, refs))


def _run_threads(refs: list[RepoRef], options: AuditOptions, cache: AuditCache, jobs: int, ends_at: float,
                 report_fn: ReportFn) -> Iterator[AuditRow]:
    from ckptinspect.sources.shared_limits import RequestLimiter, SharedLimits

    task = {"gpu": options.gpu, "gpus": options.gpus, "context": options.context, "engine": options.engine,
            "rules_dirs": [str(d) for d in options.rules_dirs], "token": options.token,
            "settings": options.settings}
    limits = SharedLimits(RequestLimiter(options.max_requests), ends_at)
    _warm_up(report_fn, task)
    pool = ThreadPoolExecutor(max_workers=min(jobs, len(refs)), thread_name_prefix="ckptinspect-audit")
    futures: dict[Future, RepoRef] = {pool.submit(_report_task, ref.repo_id, task, limits, report_fn): ref
                                      for ref in refs}
    try:
        left = set(futures)
        while left:
            wait_s = ends_at + GRACE_S - time.monotonic()
            if wait_s <= 0:
                break
            # In slices: a wait without a timeout would not see Ctrl-C until a repo finished.
            done, left = wait(left, timeout=min(wait_s, 0.5), return_when=FIRST_COMPLETED)
            for future in done:
                yield _row(futures[future], future.result(), cache)
        for future in sorted(left, key=lambda f: futures[f].repo_id):
            ref = futures[future]
            yield error_row(ref.repo_id, ref.sha, RepoError(
                "NetworkError", f"{ref.repo_id}: not finished within the audit's deadline (raise it with "
                                "--deadline or CKPTINSPECT_DEADLINE_S)"))
    finally:
        limits.limiter.close()  # running Hub reads end at their next request
        pool.shutdown(wait=False, cancel_futures=True)


def _warm_up(report_fn: ReportFn, task: dict[str, Any]) -> None:
    """One report of the bundled example with the audit's options, before the threads start: the report
    path's lazy imports and the rule files' validation happen once, in one thread, rather than in every
    thread at once. Only code and file-derived caches are warmed; no answer depends on it."""
    from ckptinspect.errors import CkptInspectError
    from ckptinspect.examples import EXAMPLE_DIR

    try:
        report_fn(str(EXAMPLE_DIR), task)
    except CkptInspectError:
        pass


def _row(ref: RepoRef, out: tuple, cache: AuditCache) -> AuditRow:
    if out[0] == "ok":
        doc = json.loads(out[1])
        doc["source"].pop("stats", None)  # per-run numbers: not part of what the repo is
        cache.put(ref.repo_id, doc)
        return row_from_report(ref.repo_id, doc)
    return error_row(ref.repo_id, ref.sha, RepoError(out[1], out[2]))


def _report_task(repo_id: str, task: dict[str, Any], limits: Any, report_fn: ReportFn) -> tuple:
    """`report REPO --format json` in an audit thread: ("ok", JSON text) or ("error", kind, one line)."""
    from ckptinspect.errors import CkptInspectError
    from ckptinspect.sources.shared_limits import shared_limits

    if time.monotonic() >= limits.ends_at:
        return ("error", "NetworkError", f"{repo_id}: the audit's deadline passed before this repo started")
    if limits.limiter.closed:
        return ("error", "NetworkError", f"{repo_id}: the audit was stopped before this repo started")
    try:
        with shared_limits(limits):  # this thread's Hub reads: the shared bound and deadline
            return ("ok", report_fn(repo_id, task))
    except CkptInspectError as exc:
        return ("error", type(exc).__name__, " ".join(str(exc).split()))
    except Exception as exc:  # noqa: BLE001 - a bug on one repo is that repo's row, never the audit's end
        return ("error", type(exc).__name__, f"{repo_id}: internal error: {' '.join(str(exc).split())[:300]}")
