"""Run many repos' reports at once: each in a worker process, under one deadline and one bound on the
requests in flight, each with the byte budget `report` has.

Why processes: the Hub reader forks helpers (the index reader, the header scanner) and may only do so
from a single-threaded process (sources/hub.py), and the pipeline is CPU-bound Python; a worker process
runs exactly `report`'s code, one repo at a time, so a row is that repo's report by construction.

Requests in flight: one repo's Hub read has at most ``CKPTINSPECT_MAX_WORKERS`` requests on its
connection pool plus the index reader's one (sources/hub.py), so ``jobs`` workers with
``max_requests // jobs - 1`` connections each never have more than ``max_requests`` in flight together
(tests/test_audit.py measures the peak on the test Hub server). The deadline is the command's: each
repo's read gets what is left of it (CKPTINSPECT_DEADLINE_S, read by sources/net_limits.py); a repo still
running when it passes is ended with the pool and becomes a row saying so.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ckptinspect.audit.cache import AuditCache, cache_root, code_fingerprint
from ckptinspect.audit.row import AuditRow, RepoError, error_row, row_from_report
from ckptinspect.audit.select import RepoRef, current_sha

DEFAULT_JOBS = 8
DEFAULT_MAX_REQUESTS = 64
GRACE_S = 5.0  # past the deadline, how long to wait for workers to report their own deadline error


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
    deadline_s: float | None = None  # None: CKPTINSPECT_DEADLINE_S or sources/net_limits.py's default
    cache: bool = True
    endpoint: str | None = None  # the Hub endpoint for the commit checks (ckptinspect.api.hub_endpoint)

    def report_options(self) -> dict[str, Any]:
        """The options that decide a report's content (the cache key holds them)."""
        return {"gpu": self.gpu, "gpus": self.gpus, "context": self.context, "engine": self.engine}


def split_concurrency(jobs: int, max_requests: int) -> tuple[int, int]:
    """(worker processes, connections per repo) whose requests in flight stay within ``max_requests``."""
    if max_requests < 2:
        raise ValueError("max_requests must be at least 2 (a repo info request and the index read)")
    jobs = max(1, min(jobs, max_requests // 2))
    return jobs, max(1, max_requests // jobs - 1)


# report_fn(repo_id, options) -> the repo's `report --format json` text; a module-level function (it is
# sent to the worker processes by name): ckptinspect.api passes its own, so a row is `report`'s answer.
ReportFn = Callable[[str, dict], str]


def run_audit(refs: Sequence[RepoRef], options: AuditOptions, report_fn: ReportFn) -> Iterator[AuditRow]:
    """Yield one row per ref as it finishes (cached ones first). Closing the iterator (or Ctrl-C)
    ends the workers; rows already yielded stay valid."""
    from ckptinspect.sources.net_limits import NetLimits

    deadline = options.deadline_s if options.deadline_s is not None else NetLimits.from_env().deadline_s
    ends_at = time.monotonic() + deadline
    cache = AuditCache(cache_root() if options.cache else None, code_fingerprint(options.rules_dirs),
                       options.report_options())
    jobs, per_repo = split_concurrency(options.jobs, options.max_requests)
    pending: list[RepoRef] = []
    for ref, doc in _cached(refs, cache, options, jobs):
        if doc is not None:
            yield row_from_report(ref.repo_id, doc, cached=True)
        else:
            pending.append(ref)
    if not pending:
        return
    yield from _run_pool(pending, options, cache, jobs, per_repo, ends_at, report_fn)


def _cached(refs: Sequence[RepoRef], cache: AuditCache, options: AuditOptions,
            jobs: int) -> list[tuple[RepoRef, dict | None]]:
    """Each ref with its cached report, if any; an explicit id whose repo is in the cache is asked for
    its current commit first (its report is not read again when the commit is unchanged)."""
    if cache.root is None:
        return [(ref, None) for ref in refs]

    def look(ref: RepoRef) -> tuple[RepoRef, dict | None]:
        sha = ref.sha
        if sha is None and cache.has_repo(ref.repo_id):
            sha = current_sha(ref.repo_id, token=options.token, endpoint=options.endpoint)
            ref = RepoRef(ref.repo_id, sha)
        return ref, cache.get(ref.repo_id, sha)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(look, refs))


def _run_pool(refs: list[RepoRef], options: AuditOptions, cache: AuditCache, jobs: int, per_repo: int,
              ends_at: float, report_fn: ReportFn) -> Iterator[AuditRow]:
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")  # never fork a process that has threads
    task = {"gpu": options.gpu, "gpus": options.gpus, "context": options.context, "engine": options.engine,
            "rules_dirs": [str(d) for d in options.rules_dirs], "token": options.token, "report_fn": report_fn}
    queued = list(range(len(refs)))[::-1]  # popped from the end: the given order
    left = set(queued)
    workers: list[_Worker] = []
    restarts = len(refs)  # a worker that dies is replaced, but a worker that cannot start is not retried for ever
    try:
        workers = [_Worker(ctx, per_repo) for _ in range(min(jobs, len(refs)))]
        while left:
            for w in workers:
                if w.index is None and queued and w.alive:
                    w.give(queued.pop(), refs, task, ends_at)
            wait_s = ends_at + GRACE_S - time.monotonic()
            if wait_s <= 0 or not workers:
                break
            ready = set(wait([w.conn for w in workers] + [w.proc.sentinel for w in workers], timeout=wait_s))
            for w in list(workers):
                out = w.take() if w.conn in ready else None
                if out is not None:
                    left.discard(out[0])
                    yield _row(refs[out[0]], out[1], cache)
                elif w.conn in ready or w.proc.sentinel in ready:  # the process ended
                    w.stop()
                    workers.remove(w)
                    if w.index is not None:
                        left.discard(w.index)
                        ref = refs[w.index]
                        yield error_row(ref.repo_id, ref.sha, RepoError(
                            "WorkerError", f"{ref.repo_id}: the process reading it exited (code {w.proc.exitcode})"))
                    if (queued or left) and restarts > 0:
                        restarts -= 1
                        workers.append(_Worker(ctx, per_repo))
        why = ("not finished within the audit's deadline (raise it with --deadline or CKPTINSPECT_DEADLINE_S)"
               if workers else "no worker process could be started")
        for index in sorted(left):  # still running when the deadline (and its grace) passed
            ref = refs[index]
            yield error_row(ref.repo_id, ref.sha, RepoError("NetworkError" if workers else "WorkerError",
                                                            f"{ref.repo_id}: {why}"))
    finally:
        for w in workers:
            w.stop()


class _Worker:
    """One worker process and the pipe it takes tasks from and answers on (a pipe, not a queue: a
    queue's feeder thread would make the worker multithreaded before the Hub reader forks)."""

    def __init__(self, ctx: Any, per_repo: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, per_repo), name="ckptinspect-audit")
        self.proc.start()
        child.close()
        self.index: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    def give(self, index: int, refs: list[RepoRef], task: dict[str, Any], ends_at: float) -> None:
        self.index = index
        self.conn.send((index, refs[index].repo_id, task, ends_at))

    def take(self) -> tuple | None:
        """(index, outcome) of the finished task, or None when the process is gone."""
        try:
            out = self.conn.recv()
        except (EOFError, OSError):
            return None
        self.index = None
        return out

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()  # SIGTERM: the worker's handler unwinds, ending its own helpers
            self.proc.join(2.0)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc.join()
        self.conn.close()


def _row(ref: RepoRef, out: tuple, cache: AuditCache) -> AuditRow:
    if out[0] == "ok":
        doc = json.loads(out[1])
        doc["source"].pop("stats", None)  # per-run numbers: not part of what the repo is
        cache.put(ref.repo_id, doc)
        return row_from_report(ref.repo_id, doc)
    return error_row(ref.repo_id, ref.sha, RepoError(out[1], out[2]))


# -- in the worker process ----------------------------------------------------------------------------
def _worker_main(conn: Any, per_repo: int) -> None:
    # Ctrl-C goes to the whole process group: the parent alone decides (it ends the workers). SIGTERM
    # unwinds like an exception, so the Hub reader ends the helpers it forked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Read by sources/hub.py at import: set before the first report imports it.
    os.environ["CKPTINSPECT_MAX_WORKERS"] = str(per_repo)
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        index, repo_id, task, ends_at = item
        conn.send((index, _report_task(repo_id, task, ends_at)))


def _report_task(repo_id: str, task: dict[str, Any], ends_at: float) -> tuple:
    """`report REPO --format json` in this worker: ("ok", JSON text) or ("error", kind, one line)."""
    from ckptinspect.errors import CkptInspectError

    left = ends_at - time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    if left <= 0:
        return ("error", "NetworkError", f"{repo_id}: the audit's deadline passed before this repo started")
    os.environ["CKPTINSPECT_DEADLINE_S"] = repr(left)
    try:
        return ("ok", task["report_fn"](repo_id, task))
    except CkptInspectError as exc:
        return ("error", type(exc).__name__, " ".join(str(exc).split()))
    except Exception as exc:  # noqa: BLE001 - a bug on one repo is that repo's row, never the audit's end
        return ("error", type(exc).__name__, f"{repo_id}: internal error: {' '.join(str(exc).split())[:300]}")
