"""Which repos an audit reads: explicit ids, a file of ids, and one Hub listing.

The listing is the request ``HfApi.list_models`` makes (hf_api.py: ``GET /api/models`` with ``filter``,
``author``, ``search``, ``limit`` and ``expand`` repeated; utils/_pagination.py: the next page is the
``Link`` header's ``rel="next"`` URL, and the listing ends when there is none), made by the one bounded
client (sources/hub_client.py), so the command's deadline, byte budget, Retry-After and body caps hold for
it as for every other Hub request. ``--quantized-from BASE`` is the Hub's ``base_model:quantized:BASE``
tag filter, ``--author`` and ``--search`` its ``author`` and ``search`` parameters; given together they
narrow one listing, as on the Hub. ``expand=sha`` returns each repo's commit in the same call, so the
audit cache can tell an unchanged repo without asking again. An explicit id's commit is asked for
(``/api/models/{id}?expand=sha``, ``HfApi.model_info(expand=["sha"])``'s request) only when the cache holds
a report of that repo: otherwise the report's own repo-info call says it.

A listing is a server's answer, so it is checked like one: every listed id must be a Hub repo id
(huggingface_hub's ``validate_repo_id``; ``../../x``, ``/etc``, ``./dir`` or an id holding ESC, CR or a
newline is refused, never read as a local path or printed raw); a ``Link`` to a page already read, or to
another host (which would get the token), ends the listing with an error; a listing of more than
``MAX_LISTED`` repos is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from ckptinspect.settings import DEFAULTS
from ckptinspect.errors import AccessError, CkptInspectError, NetworkError, NotFoundError

LIST_EXPAND = ["sha"]
MAX_LISTED = 100_000  # repos one listing may name (the Hub's largest bases have a few thousand quants)
MAX_PAGE_BYTES = 64 * 1024 * 1024  # one page of 1,000 entries with their commits is ~100 KB
LISTING = "model listing"  # how the listing's requests are named in error lines
_NEXT = re.compile(r'<([^>]{1,8192})>\s*;\s*rel="?next"?', re.IGNORECASE)
# --repos-file: read through the guarded reader (a regular file, refused over the cap before anything is
# read), so a FIFO, /dev/zero or a sparse 2 GiB file is one error line, not a hang or a MemoryError. An
# audit of the largest Hub orgs is a few thousand repos; 100,000 ids of up to 1,000 characters is far above.
MAX_IDS_FILE_BYTES = 8 * 1024 * 1024
MAX_IDS = 100_000
MAX_ID_CHARS = 1_000


@dataclass(frozen=True)
class RepoRef:
    """A repo to audit; ``sha`` is its current commit when a listing said so (else None). ``listed``: a
    Hub listing named it, so it is read from the HF cache or the Hub only, never as a local path."""

    repo_id: str
    sha: str | None = None
    listed: bool = False


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
    """One repo id per line; blank lines and ``#`` comments skipped. At most ``MAX_IDS`` ids of at most
    ``MAX_ID_CHARS`` characters, no control characters; anything else is one error naming the file."""
    from ckptinspect.guarded_file import read_text

    text = read_text(path, what="the file of repo ids", cap=MAX_IDS_FILE_BYTES)
    ids = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line.split()) != 1:
            raise CkptInspectError(f"line {n}: one repo id per line, got {line[:80]!r}", path=str(path))
        if len(line) > MAX_ID_CHARS or not line.isprintable():
            raise CkptInspectError(f"line {n}: not a repo id ({len(line):,} characters, {line[:80]!r})",
                                   path=str(path))
        if len(ids) == MAX_IDS:
            raise CkptInspectError(f"more than {MAX_IDS:,} repo ids", path=str(path))
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
    from ckptinspect.sources.net_edge import run_sync

    return run_sync(lambda: list_repos_async(selection, token=token, endpoint=endpoint))


async def list_repos_async(selection: Selection, *, token: str | None = None,
                           endpoint: str | None = None) -> list[RepoRef]:
    from ckptinspect.sources.hub_session import hub_session

    params: list[tuple[str, str]] = []
    if selection.quantized_from:
        params.append(("filter", f"base_model:quantized:{selection.quantized_from}"))
    if selection.author:
        params.append(("author", selection.author))
    if selection.search:
        params.append(("search", selection.search))
    if selection.limit is not None:
        params.append(("limit", str(selection.limit)))
    what = ", ".join(f"{k}={v}" for k, v in params)
    params += [("expand", e) for e in LIST_EXPAND]
    session = hub_session(endpoint, token)
    url: str | None = f"{session.endpoint}/api/models?{urlencode(params)}"
    origin = urlsplit(session.endpoint)[:2]
    seen: set[str] = set()
    refs: list[RepoRef] = []
    try:
        async with session.open(LISTING) as client:
            while url is not None and (selection.limit is None or len(refs) < selection.limit):
                if url in seen:
                    raise NetworkError("the listing's Link header points back to a page already read "
                                       f"(page {len(seen) + 1}); the listing would never end", path=what)
                seen.add(url)
                status, headers, body = await _fetch(client, url, what)
                listed, url = read_page(status, headers, body, url, what, origin=origin, start=len(refs))
                refs.extend(listed)
                if len(refs) > MAX_LISTED:
                    raise NetworkError(f"the listing names more than {MAX_LISTED:,} repos", path=what)
    except CkptInspectError as exc:
        raise session.scrubbed(exc) from None
    return refs[:selection.limit] if selection.limit is not None else refs


async def _fetch(client: Any, url: str, what: str) -> tuple[int, dict[str, str], bytes]:
    """One page's answer (status, headers, body), a transport failure as one listing error line."""
    try:
        return await client.get_document(url, LISTING, {"Accept": "application/json"}, MAX_PAGE_BYTES)
    except NetworkError as exc:
        raise NetworkError(f"Hub listing failed: {str(exc).removeprefix(f'{LISTING}/{LISTING}: ')}",
                           path=what) from None


def read_page(status: int, headers: dict[str, str], body: bytes, url: str, what: str, *,
              origin: tuple[str, str], start: int) -> tuple[list[RepoRef], str | None]:
    """One listing answer (from ``url``) -> its repos and the next page's URL (None: the last page).
    Everything a server chose passes here, with no I/O, so benchmarks/fuzz.py feeds it hostile pages
    directly: a refusal is one CkptInspectError line; a next page on another ``origin`` (scheme, host)
    than the endpoint's is refused, since it would get the token."""
    from ckptinspect.sources.net_json import decode_answer

    _raise_for_status(status, headers, body, url, what)
    page = decode_answer(body, source=f"the Hub listing ({what})")
    link = _NEXT.search(headers.get("link", ""))
    try:  # urljoin / urlsplit raise ValueError on a malformed URL ("http://[::1", a bad IPv6 host)
        following = urljoin(url, link.group(1)) if link else None
        foreign = following is not None and urlsplit(following)[:2] != origin
    except ValueError:
        raise NetworkError(f"the listing's Link header names no usable URL: {link.group(1)[:80]!r}",
                           path=what) from None
    if foreign:
        raise NetworkError("the listing's next page is on another host than the endpoint; not "
                           "followed (it would get the token)", path=what)
    return _listed(page, what, start=start), following


def _listed(page: Any, what: str, *, start: int) -> list[RepoRef]:
    """The repos of one page, each id checked as a Hub repo id (never a path, never terminal control)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(page, list):
        raise NetworkError("the Hub listing's page is not a JSON list", path=what)
    if start + len(page) > MAX_LISTED:  # before the ids are checked: one 64 MB page can hold ~2M entries
        raise NetworkError(f"the listing names more than {MAX_LISTED:,} repos", path=what)
    refs = []
    for n, entry in enumerate(page, start + 1):
        repo_id = entry.get("id") if isinstance(entry, dict) else None
        sha = entry.get("sha") if isinstance(entry, dict) else None
        valid = isinstance(repo_id, str) and "/" in repo_id
        if valid:
            try:
                validate_repo_id(repo_id)
            except HFValidationError:
                valid = False
        if not valid:  # raised outside the except block: the validator's text (the raw id) is no cause of it
            raise NetworkError(f"the Hub listing's entry {n} is not a repo id: {str(repo_id)[:80]!r}", path=what)
        refs.append(RepoRef(repo_id, sha if isinstance(sha, str) and sha.isalnum() else None, listed=True))
    return refs


def current_sha(repo_id: str, *, token: str | None = None, endpoint: str | None = None) -> str | None:
    from ckptinspect.sources.net_edge import run_sync

    return run_sync(lambda: current_sha_async(repo_id, token=token, endpoint=endpoint))


async def current_sha_async(repo_id: str, *, token: str | None = None, endpoint: str | None = None,
                            limiter: Any = None, ends_at: float | None = None) -> str | None:
    """The commit ``main`` points to now (``HfApi.model_info(expand=["sha"])``'s request), or None when
    the Hub does not say (the report then reads the repo, and says why if it cannot)."""
    from urllib.parse import quote

    from ckptinspect.sources.hub_session import hub_session
    from ckptinspect.sources.net_json import decode_answer

    session = hub_session(endpoint, token, ends_at=ends_at)
    url = f"{session.endpoint}/api/models/{quote(repo_id, safe='/')}?expand=sha"
    try:
        async with session.open(repo_id, limiter) as client:
            status, headers, body = await client.get_document(url, "commit", {"Accept": "application/json"},
                                                              1 << 20)
        if status != 200:
            return None
        info = decode_answer(body, source=f"{repo_id} commit")
    except CkptInspectError:
        return None
    sha = info.get("sha") if isinstance(info, dict) else None
    return sha if isinstance(sha, str) and sha.isalnum() else None


def _raise_for_status(status: int, headers: dict[str, str], body: bytes, url: str, what: str) -> None:
    """huggingface_hub's own error mapping (``hf_raise_for_status``) of a listing answer, as one line."""
    if status == 200:
        return
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.utils import hf_raise_for_status

    from ckptinspect.sources.hub_client import httpx_module

    httpx = httpx_module()
    try:
        # header values as bytes: httpx decoded them (as UTF-8, else Latin-1) and re-encodes str values as
        # ASCII, so a header holding 'é' or U+202E was a UnicodeEncodeError here
        response = httpx.Response(status, headers={k: v.encode("utf-8", "surrogateescape") for k, v in headers.items()},
                                  content=body, request=httpx.Request("GET", url))
        hf_raise_for_status(response)
    except GatedRepoError as exc:
        raise AccessError(f"gated: {_first_line(exc)}", path=what) from None
    except RepositoryNotFoundError as exc:
        raise NotFoundError(_first_line(exc), path=what) from None
    except HfHubHTTPError as exc:
        raise NetworkError(f"Hub listing failed: {_first_line(exc)}", path=what) from None
    except Exception:  # noqa: BLE001 - huggingface_hub reads the error body as a JSON object
        # ('data.get("error")'): a JSON list or string there was its AttributeError; the status still says it
        pass
    raise NetworkError(f"Hub listing failed: HTTP {status}", path=what)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
