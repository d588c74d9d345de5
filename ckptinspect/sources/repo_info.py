"""The repo-info call of the Hub reader: ``HfApi.model_info(files_metadata=True)``'s request, made by the
Hub client (sources/hub_client.py) so that the deadlines, the byte budget and ``--verbose``'s byte count cover it too, and its
answer read by huggingface_hub's own error mapping (``hf_raise_for_status``). Of the answer only the commit
and each file's name, size and etag are used; they are type-checked (a server's answer is input like any
other) and kept in a small record, read as ``ModelInfo`` / ``RepoSibling`` read them (hf_api.py): the
etag is the LFS sha256, else the git blob id. Building ``ModelInfo`` itself would import
``huggingface_hub.hf_api`` (~50 ms of CPU, 2-3% of a remote report of a large checkpoint) for nothing the
report reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ckptinspect.errors import AccessError, NetworkError, NotFoundError
from ckptinspect.sources.hub_client import HubClient, httpx_module
from ckptinspect.sources.interface import parse_json_bytes

MAX_INFO_BYTES = 64 * 1024 * 1024  # repo info with blob metadata: ~200 bytes per file
INFO_NAME = "repo info"  # how the request is named in the range client's messages


@dataclass(frozen=True)
class RepoFile:
    """One file of the repo at the commit: ``rfilename``, ``size`` and ``blobId`` / ``lfs.sha256`` of the
    repo info's ``siblings`` entry."""

    rfilename: str
    size: int | None
    etag: str | None  # the LFS sha256, else the git blob id: what huggingface_hub names the blob by


@dataclass(frozen=True)
class RepoInfo:
    sha: str | None  # the commit the revision resolved to
    siblings: tuple[RepoFile, ...]


async def model_info(client: HubClient, endpoint: str, repo_id: str, revision: str | None, *,
                     missing: str = "repository not found (or private: pass --token)") -> RepoInfo:
    """``HfApi.model_info(files_metadata=True)``, the request made by the Hub client (so the deadlines,
    byte budget and byte count apply to it too) and the answer read by huggingface_hub's own error
    mapping (``hf_raise_for_status``)."""
    httpx = httpx_module()
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    from huggingface_hub.utils import HFValidationError, hf_raise_for_status, validate_repo_id

    rev = revision or "main"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise NotFoundError(f"not a valid repo id: {exc}", path=repo_id) from None
    url = f"{endpoint}/api/models/{repo_id}"  # the URL model_info builds (hf_api.py)
    url += ("" if revision is None else f"/revision/{quote(revision, safe='')}") + "?blobs=True"
    try:
        status, headers, body = await client.get_document(url, INFO_NAME, {"Accept": "application/json"}, MAX_INFO_BYTES)
    except NetworkError as exc:
        detail = str(exc).removeprefix(f"{repo_id}/{INFO_NAME}: ")
        raise NetworkError(f"cannot read the repo info: {detail}", path=repo_id) from None
    response = httpx.Response(status, headers=headers, content=body, request=httpx.Request("GET", url))
    try:
        hf_raise_for_status(response)
    except GatedRepoError:
        raise AccessError("gated repo: accept its terms on the Hub, then pass --token or set HF_TOKEN",
                          path=repo_id) from None
    except RevisionNotFoundError:
        raise NotFoundError(f"revision {rev!r} not found", path=repo_id) from None
    except RepositoryNotFoundError:
        raise NotFoundError(missing, path=repo_id) from None
    except HfHubHTTPError:
        if status in (401, 403):
            raise AccessError(f"HTTP {status} reading repo info (pass --token or set HF_TOKEN)",
                              path=repo_id) from None
        raise NetworkError(f"HTTP {status} reading repo info", path=repo_id) from None
    if status != 200:
        raise NetworkError(f"HTTP {status} reading repo info", path=repo_id)
    data = parse_json_bytes(body, source=f"{repo_id} repo info")
    _check_repo_info(data, repo_id)
    return RepoInfo(sha=data.get("sha"), siblings=tuple(
        RepoFile(sib["rfilename"], sib.get("size"), (sib["lfs"].get("sha256") or None) if sib.get("lfs") else sib.get("blobId"))
        for sib in data.get("siblings") or ()))


def _check_repo_info(data: Any, repo_id: str) -> None:
    """The fields of the repo info that later code computes with, typed as the Hub types them (a
    server's answer is input like any other: a size of "abc" must not become a traceback)."""
    def bad(what: str, value: Any) -> NetworkError:
        return NetworkError(f"the repo info has {what} = {str(value)[:60]!r}", path=repo_id)

    if not isinstance(data, dict) or not isinstance(data.get("siblings", []), list):
        raise NetworkError("the repo info is not a JSON object with a 'siblings' list", path=repo_id)
    if data.get("sha") is not None and not isinstance(data["sha"], str):
        raise bad("sha", data["sha"])
    for i, sib in enumerate(data.get("siblings") or []):
        if not isinstance(sib, dict) or not isinstance(sib.get("rfilename"), str) or not sib["rfilename"] \
                or "\0" in sib["rfilename"]:
            raise bad(f"siblings[{i}]", sib)
        size = sib.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise bad(f"siblings[{i}].size", size)
        if sib.get("blobId") is not None and not isinstance(sib["blobId"], str):
            raise bad(f"siblings[{i}].blobId", sib["blobId"])
        lfs = sib.get("lfs")
        if lfs is not None and not (isinstance(lfs, dict) and isinstance(lfs.get("sha256", ""), str)):
            raise bad(f"siblings[{i}].lfs", lfs)
