"""The Hub's model listing for the test Hub server (hub_server.py): ``GET /api/models`` and ``expand`` on
``GET /api/models/{repo}``, as huggingface_hub 2.4's ``HfApi.list_models`` / ``model_info`` call and read
them (hf_api.py ``list_models``: ``filter`` repeated, ``author``, ``search``, ``limit``, ``expand``
repeated; utils/_pagination.py ``paginate``: the next page is the ``Link`` header's ``rel="next"`` URL,
requested as is, and the listing ends when there is none).

How the Hub answers, as modelled here:

- every ``filter`` value must be one of the repo's tags (``base_model:quantized:ORG/NAME`` is a tag the
  Hub derives from the model card's ``base_model`` and ``base_model_relation: quantized``);
  ``author`` is the owner (case-insensitive), ``search`` a case-insensitive substring of the repo id;
- a page holds ``limit`` entries (at most ``page_size``, the Hub's 1000); when more match, the answer
  has ``Link: <...&cursor=...>; rel="next"``, the cursor an opaque token;
- without ``expand`` an entry has the Hub's default fields; with it, ``_id`` and ``id`` plus exactly the
  expanded properties (an unknown one is ``400``);
- ``siblings`` in a listing carry ``rfilename`` only (blob sizes come from ``?blobs=true`` on one repo).
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlencode

HUB_MAX_PAGE = 1000
# What huggingface_hub 2.4 types as ExpandModelProperty_T (hf_api.py) and this server can answer.
EXPANDABLE = {"author", "createdAt", "disabled", "downloads", "gated", "lastModified", "library_name", "likes",
              "pipeline_tag", "private", "sha", "siblings", "tags", "cardData", "config", "safetensors",
              "spaces", "trendingScore", "widgetData", "transformersInfo", "model-index", "downloadsAllTime",
              "gguf", "inference", "inferenceProviderMapping", "evalResults", "mask_token", "resourceGroup"}
DEFAULT_FIELDS = ("_id", "id", "likes", "trendingScore", "private", "downloads", "tags", "pipeline_tag",
                  "library_name", "createdAt", "modelId")


def repo_entry(hub: Any, repo: Any, *, blobs: bool = False) -> dict[str, Any]:
    """Everything the server knows of ``repo`` at ``main``, in the Hub's field names."""
    sha = repo.commits["main"]
    files = hub._files(repo, sha, repo.revisions["main"])
    siblings = []
    for f in files:
        sib: dict[str, Any] = {"rfilename": f["path"]}
        if blobs:
            sib.update(size=f["size"], blobId=f["oid"])
            if "lfs" in f:
                sib["lfs"] = {"sha256": f["lfs"]["oid"], "size": f["size"], "pointerSize": 134}
        siblings.append(sib)
    return {"_id": sha[:24], "id": repo.repo_id, "modelId": repo.repo_id, "author": repo.repo_id.split("/")[0],
            "sha": sha, "private": False, "gated": "manual" if repo.gated_token else False, "disabled": False,
            "downloads": 0, "likes": 0, "trendingScore": 0, "tags": list(getattr(repo, "tags", ())),
            "pipeline_tag": "text-generation", "library_name": "transformers", "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"}


def bad_expand(query: dict[str, list[str]]) -> str | None:
    unknown = [e for e in query.get("expand", []) if e not in EXPANDABLE]
    return f"Invalid expand value(s): {', '.join(unknown)}" if unknown else None


def expanded(info: dict[str, Any], query: dict[str, list[str]]) -> dict[str, Any]:
    """``info`` cut down to ``_id``, ``id`` and the ``expand`` properties, when the query has any."""
    wanted = query.get("expand")
    if not wanted:
        return info
    return {k: info[k] for k in ("_id", "id", *wanted) if k in info}


def _matches(entry: dict[str, Any], query: dict[str, list[str]]) -> bool:
    tags = set(entry["tags"])
    if any(f not in tags for f in query.get("filter", [])):
        return False
    author = query.get("author", [None])[0]
    if author is not None and entry["author"].lower() != author.lower():
        return False
    search = query.get("search", [None])[0]
    return search is None or search.lower() in entry["id"].lower()


def list_models(handler: Any, query: dict[str, list[str]], method: str) -> None:
    """Answer ``GET /api/models`` on ``handler`` (a hub_server request handler)."""
    hub = handler.hub
    problem = bad_expand(query)
    if problem:
        return handler._error(400, "BadRequest", problem, method)
    try:
        limit = int(query["limit"][0]) if "limit" in query else None
        offset = json.loads(base64.urlsafe_b64decode(query["cursor"][0]))["offset"] if "cursor" in query else 0
    except (ValueError, KeyError, TypeError):
        return handler._error(400, "BadRequest", "invalid limit or cursor", method)
    if limit is not None and limit < 1:
        return handler._error(400, "BadRequest", "limit must be positive", method)
    page_size = min(limit or HUB_MAX_PAGE, HUB_MAX_PAGE, getattr(hub, "listing_page_size", HUB_MAX_PAGE))
    entries = [repo_entry(hub, repo) for _, repo in sorted(hub._repos.items())]
    matching = [e for e in entries if _matches(e, query)]
    page = matching[offset:offset + page_size]
    fields = ("_id", "id", *query["expand"]) if query.get("expand") else DEFAULT_FIELDS
    body = [{k: e[k] for k in fields if k in e} for e in page]
    headers = {}
    if offset + page_size < len(matching):
        cursor = base64.urlsafe_b64encode(json.dumps({"offset": offset + page_size}).encode()).decode()
        params = [(k, v) for k, values in query.items() if k != "cursor" for v in values] + [("cursor", cursor)]
        headers["Link"] = f'<{hub.url}/api/models?{urlencode(params)}>; rel="next"'
    handler._json(body, method, headers)
