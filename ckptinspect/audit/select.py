"""Which repos an audit reads: explicit ids, a file of ids, and one Hub listing.

The listing is huggingface_hub's own ``HfApi.list_models`` (its query parameters, its ``Link``-header
pagination, its error mapping), never a hand-written query: ``--quantized-from BASE`` is the Hub's
``base_model:quantized:BASE`` tag filter, ``--author`` and ``--search`` its ``author`` and ``search``
parameters; given together they narrow one listing, as on the Hub. ``expand=["sha", "siblings"]``
returns each repo's commit and file list in the same call, so the audit cache can tell an unchanged repo
without asking again. An explicit id's commit is asked for (``HfApi.model_info(expand=["sha"])``) only
when the cache holds a report of that repo: otherwise the report's own repo-info call says it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptinspect.settings import DEFAULTS
from ckptinspect.errors import AccessError, CkptInspectError, NetworkError, NotFoundError

LIST_EXPAND = ["sha", "siblings"]


@dataclass(frozen=True)
class RepoRef:
    """A repo to audit; ``sha`` is its current commit when a listing said so (else None)."""

    repo_id: str
    sha: str | None = None


@dataclass(frozen=True)
class Selection:
    ids: tuple[str, ...] = ()
    ids_file: Path | None = None
    quantized_from: str | None = None
    author: str | None = None
    search: str | None = None
    limit: int | None = None

    @property
    def lists(self) -> bool:
        return bool(self.quantized_from or self.author or self.search)

    @property
    def empty(self) -> bool:
        return not (self.ids or self.ids_file or self.lists)


def read_ids_file(path: Path) -> list[str]:
    """One repo id per line; blank lines and ``#`` comments skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NotFoundError(f"cannot read the file of repo ids: {exc}", path=str(path)) from None
    ids = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line.split()) != 1:
            raise CkptInspectError(f"line {n}: one repo id per line, got {line[:80]!r}", path=str(path))
        ids.append(line)
    return ids


def select_repos(selection: Selection, *, token: str | None = None, endpoint: str | None = None) -> list[RepoRef]:
    """The repos of ``selection``, in order (explicit ids, the file's ids, then the listing), each once."""
    refs: dict[str, RepoRef] = {}
    explicit = list(selection.ids) + (read_ids_file(selection.ids_file) if selection.ids_file else [])
    for repo_id in explicit:
        refs.setdefault(repo_id, RepoRef(repo_id))
    if selection.lists:
        for ref in list_repos(selection, token=token, endpoint=endpoint):
            if ref.repo_id not in refs or refs[ref.repo_id].sha is None:
                refs[ref.repo_id] = ref
    return list(refs.values())


def list_repos(selection: Selection, *, token: str | None = None, endpoint: str | None = None) -> list[RepoRef]:
    api = _hf_api(token, endpoint)
    kwargs: dict[str, Any] = {"expand": LIST_EXPAND}
    if selection.quantized_from:
        kwargs["filter"] = f"base_model:quantized:{selection.quantized_from}"
    if selection.author:
        kwargs["author"] = selection.author
    if selection.search:
        kwargs["search"] = selection.search
    if selection.limit is not None:
        kwargs["limit"] = selection.limit
    what = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "expand")
    return [RepoRef(info.id, info.sha) for info in _hub_call(lambda: list(api.list_models(**kwargs)), what)]


def current_sha(repo_id: str, *, token: str | None = None, endpoint: str | None = None,
                timeout_s: float = DEFAULTS.request_timeout_s) -> str | None:
    """The commit ``main`` points to now (``HfApi.model_info(expand=["sha"])``), or None when the Hub
    does not say (the report then reads the repo, and says why if it cannot)."""
    api = _hf_api(token, endpoint)
    try:
        info = _hub_call(lambda: api.model_info(repo_id, expand=["sha"], timeout=timeout_s), repo_id)
    except CkptInspectError:
        return None
    return info.sha if isinstance(info.sha, str) else None


def _hf_api(token: str | None, endpoint: str | None) -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)  # ckptinspect.api passes the endpoint `report` uses


def _hub_call(call: Any, what: str) -> Any:
    """Run one huggingface_hub call; its errors become the project's one-line errors."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        return call()
    except GatedRepoError as exc:
        raise AccessError(f"gated: {_first_line(exc)}", path=what) from None
    except RepositoryNotFoundError as exc:
        raise NotFoundError(_first_line(exc), path=what) from None
    except HfHubHTTPError as exc:
        raise NetworkError(f"Hub listing failed: {_first_line(exc)}", path=what) from None
    except Exception as exc:  # noqa: BLE001 - httpx's connection errors, an unreadable answer: still an error
        raise NetworkError(f"Hub listing failed: {type(exc).__name__}: {_first_line(exc)}", path=what) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
