"""A repo (or directory) of several GGUF quants is several audit rows, one per quant, as `report
REPO:TAG` reads each: the usual Hub layout ships every quant of a model in one repo, and `report` asks
for ``:TAG`` there (sources/gguf_files.py ``select_set``), which an audit of many repos cannot type.

The first pass runs every repo as named; the repos that answered "several GGUF models" are listed once
more (one repo-info call, or the directory) and each quant is run as ``REPO:TAG``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ckptinspect.audit.row import AuditRow
from ckptinspect.audit.select import RepoRef
from ckptinspect.errors import CkptInspectError
from ckptinspect.settings import DEFAULTS, Settings

QUANT_CHOICE = "GgufQuantChoice"  # the error kind of a repo named without :TAG (ckptinspect/errors.py)


def expand_gguf_quants(rows: Iterable[AuditRow], rerun: Callable[[list[RepoRef]], Iterable[AuditRow]],
                       list_files: Callable[[str], list[str]]) -> Iterator[AuditRow]:
    """``rows`` as they come, except a repo of several GGUF quants, which becomes one row per quant
    (``rerun`` reads the ``REPO:TAG`` refs); a repo whose files cannot be listed keeps its error row."""
    from ckptinspect.sources.gguf_files import model_sets, quant_tag

    several: list[AuditRow] = []
    try:
        for row in rows:
            if row.error is not None and row.error.kind == QUANT_CHOICE:
                several.append(row)
            else:
                yield row
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
    refs: list[RepoRef] = []
    for row in several:
        try:
            names = list_files(row.repo)
        except CkptInspectError:
            yield row
            continue
        tags = [quant_tag(names, model) for model in model_sets(names)]
        if not tags or None in tags:  # a quant no :TAG selects alone: the repo's own answer stands
            yield row
            continue
        refs.extend(RepoRef(f"{row.repo}:{tag}", row.revision) for tag in tags)
    if refs:
        again = rerun(refs)
        try:
            yield from again
        finally:
            close = getattr(again, "close", None)
            if close is not None:
                close()


def repo_files(ref: str, *, token: str | None, endpoint: str | None, settings: Settings = DEFAULTS) -> list[str]:
    """The file names of a local directory (relative, '/'-separated) or a Hub repo (one repo-info call, made
    by the one bounded client: the command's deadline, byte budget and attempts apply to it)."""
    root = Path(ref)
    if root.is_dir():
        return sorted(str(p.relative_to(root)).replace(os.sep, "/") for p in root.rglob("*") if p.is_file())
    from ckptinspect.sources.hub_session import hub_session
    from ckptinspect.sources.net_edge import run_sync
    from ckptinspect.sources.repo_info import model_info

    async def read() -> list[str]:
        session = hub_session(endpoint, token, settings=settings)
        async with session.open(ref) as client:
            info = await model_info(client, session.endpoint, ref, None)
        return [s.rfilename for s in info.siblings]

    return run_sync(read)
