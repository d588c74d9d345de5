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

import importlib
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
    from multiprocessing.connection import wait

    task = {"gpu": options.gpu, "gpus": options.gpus, "context": options.context, "engine": options.engine,
            "rules_dirs": [str(d) for d in options.rules_dirs], "token": options.token, "report_fn": report_fn}
    queued = list(range(len(refs)))[::-1]  # popped from the end: the given order
    left = set(queued)
    pool = _Pool(min(jobs, len(refs)), per_repo, restarts=len(refs), task=task)
    try:
        while left and pool.alive():
            for i in pool.idle():
                if queued:
                    pool.give(i, queued.pop(), refs, task, ends_at)
            wait_s = ends_at + GRACE_S - time.monotonic()
            if wait_s <= 0:
                break
            for event in pool.events(wait(pool.waitables(), timeout=wait_s)):
                kind, index, value = event
                if index not in left:
                    continue
                left.discard(index)
                ref = refs[index]
                if kind == "done":
                    yield _row(ref, value, cache)
                else:
                    yield error_row(ref.repo_id, ref.sha, RepoError(
                        "WorkerError", f"{ref.repo_id}: the process reading it exited (code {value})"))
        why = ("not finished within the audit's deadline (raise it with --deadline or CKPTINSPECT_DEADLINE_S)"
               if pool.alive() else "the audit's worker processes ended")
        for index in sorted(left):
            ref = refs[index]
            yield error_row(ref.repo_id, ref.sha, RepoError("NetworkError" if pool.alive() else "WorkerError",
                                                            f"{ref.repo_id}: {why}"))
    finally:
        pool.close()


class _Pool:
    """Worker processes forked by one spawned parent of theirs (the zygote), which imports the report's
    code once: a fresh interpreter per worker would spend ~1.5 s of CPU each on imports and first-use
    set-up, more than the reports themselves on a small machine. Tasks and answers go over one pipe
    per worker (not a queue: its feeder thread would make a worker multithreaded before the Hub reader
    forks); the zygote reports a worker that died (its task becomes an error row) and forks another."""

    def __init__(self, size: int, per_repo: int, restarts: int, task: dict) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # never fork the caller: it may have threads
        pairs = [ctx.Pipe() for _ in range(size)]
        self.conns = [p for p, _ in pairs]
        self.ctl, ctl_child = ctx.Pipe()
        self.zygote = ctx.Process(target=_zygote_main, args=(ctl_child, [c for _, c in pairs], per_repo, restarts, task),
                                  name="ckptinspect-audit")
        self.zygote.start()
        for _, child in pairs:
            child.close()
        ctl_child.close()
        self.running: list[int | None] = [None] * size
        self.usable = [True] * size

    def alive(self) -> bool:
        return self.zygote.is_alive() and any(self.usable)

    def idle(self) -> list[int]:
        return [i for i, r in enumerate(self.running) if r is None and self.usable[i]]

    def give(self, worker: int, index: int, refs: list[RepoRef], task: dict, ends_at: float) -> None:
        self.running[worker] = index
        self.conns[worker].send((index, refs[index].repo_id, task, ends_at))

    def waitables(self) -> list[Any]:
        return [c for i, c in enumerate(self.conns) if self.usable[i]] + [self.ctl, self.zygote.sentinel]

    def events(self, ready: list[Any]) -> list[tuple[str, int, Any]]:
        """("done", task index, outcome) and ("died", task index, exit code) for what ``ready`` holds."""
        out = []
        # Answers first: a worker that answered and then died has no task left to report as lost.
        for worker, conn in enumerate(self.conns):
            if conn in ready and self.usable[worker]:
                try:
                    index, outcome = conn.recv()
                except (EOFError, OSError):
                    continue  # the worker died: the zygote's message says so
                self.running[worker] = None
                out.append(("done", index, outcome))
        if self.ctl in ready:
            while self.ctl.poll():
                try:
                    what, worker, code = self.ctl.recv()
                except (EOFError, OSError):
                    break
                index, self.running[worker] = self.running[worker], None
                if what == "gone":
                    self.usable[worker] = False
                if index is not None:
                    out.append(("died", index, code))
        return out

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        if self.zygote.is_alive():
            self.zygote.terminate()  # SIGTERM: the zygote ends its workers, then itself
            self.zygote.join(3.0)
            if self.zygote.is_alive():
                self.zygote.kill()
        self.zygote.join()
        for conn in (*self.conns, self.ctl):
            conn.close()


def _row(ref: RepoRef, out: tuple, cache: AuditCache) -> AuditRow:
    if out[0] == "ok":
        doc = json.loads(out[1])
        doc["source"].pop("stats", None)  # per-run numbers: not part of what the repo is
        cache.put(ref.repo_id, doc)
        return row_from_report(ref.repo_id, doc)
    return error_row(ref.repo_id, ref.sha, RepoError(out[1], out[2]))


# -- in the zygote and the worker processes ----------------------------------------------------------
def _zygote_main(ctl: Any, conns: list[Any], per_repo: int, restarts: int, task: dict) -> None:
    """Warm up, fork one worker per pipe, fork a new one when one dies."""
    # Ctrl-C goes to the whole process group: the caller alone decides (it ends the zygote). SIGTERM
    # unwinds like an exception, in the zygote and in the workers it forks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Read by sources/hub.py at import: set before the imports below.
    os.environ["CKPTINSPECT_MAX_WORKERS"] = str(per_repo)
    # One repo's latency savers fork helper processes per report (the index reader, the header scanner,
    # scan workers); with many repos at once the other repos fill that wait, and the forks only cost
    # CPU. The report is the same either way (sources/hub.py, inventory/parallel.py).
    os.environ.update({"CKPTINSPECT_INDEX_PREFETCH": "0", "CKPTINSPECT_SCAN_AHEAD": "0", "CKPTINSPECT_WORKERS": "1"})
    import huggingface_hub.hf_api  # noqa: F401 - what the Hub reader imports on first use (~0.5 s)
    import huggingface_hub.utils  # noqa: F401

    try:  # the Hub reader: not reached by the warm-up below (a warm-up only: its absence costs time)
        importlib.import_module("ckptinspect.sources.hub")
    except ImportError:
        pass
    from ckptinspect.errors import CkptInspectError
    from ckptinspect.examples import EXAMPLE_DIR

    # One report of the bundled example with the audit's options: every lazy import of the report path
    # and the rule files' validation (kept in the rule cache) happen once here, not once per worker.
    # Only code and file-derived caches are warmed; no answer depends on it.
    try:
        task["report_fn"](str(EXAMPLE_DIR), task)
    except CkptInspectError:
        pass
    from tqdm import tqdm

    # tqdm makes a process-shared lock on first use; made here, the workers share it (each worker's own
    # would outlive it: workers leave with os._exit, which skips the lock's unlinking).
    tqdm.get_lock()

    pids = {_fork_worker(conns[i]): i for i in range(len(conns))}
    try:
        while pids:
            pid, status = os.wait()
            worker = pids.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if worker is None or code == 0:
                continue  # a worker that was told to stop
            if restarts > 0:
                restarts -= 1
                ctl.send(("died", worker, code))
                pids[_fork_worker(conns[worker])] = worker
            else:
                ctl.send(("gone", worker, code))
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _fork_worker(conn: Any) -> int:
    pid = os.fork()  # the zygote is single-threaded: nothing is held at the fork
    if pid:
        return pid
    code = 0
    try:
        _serve(conn)
    except BaseException:  # noqa: BLE001 - SIGTERM's SystemExit included: leave without cleanup of the zygote's state
        code = 1
    finally:
        os._exit(code)


def _serve(conn: Any) -> None:
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):  # the caller is gone
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
