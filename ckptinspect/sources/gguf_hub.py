"""GGUF headers from a Hub repo over HTTP range requests, on huggingface_hub's own HTTP client.

One repo-info call (``HfApi.model_info(files_metadata=True)``: file names, sizes, the commit) picks
the model set and its MTP companions; each file's header is then read with ``Range`` requests through
``huggingface_hub.get_session()`` (the library's shared httpx client, with its proxy / SSL / user-agent
configuration) and ``build_hf_headers(token=...)`` (the same auth headers ``hf_hub_download`` sends),
errors mapped by ``hf_raise_for_status``. The first range is 16 KiB; every further range starts at the
current end and is sized by the parser from what it already knows (the remaining items of an array
times their mean size so far), so a 12 MB tokenizer costs a few requests and the bytes received stay
within a few percent of the header. Tensor data is never requested: a server that ignores ``Range``
is cut off after the bytes asked for, and reported.
"""

from __future__ import annotations

import time
from typing import Any

from ckptinspect.errors import AccessError, HeaderError, NetworkError, NotFoundError, SourceError
from ckptinspect.header.gguf import ByteWindow, GgufHeader, parse_gguf
from ckptinspect.sources.gguf_files import RawGguf, check_split, companions_for, select_set

FIRST_RANGE = 16 << 10
ATTEMPTS = 3
TIMEOUT_S = 30.0


def open_gguf_hub(repo_id: str, *, ref: str, tag: str | None, revision: str | None, token: str | None,
                  endpoint: str | None = None) -> RawGguf:
    from huggingface_hub import HfApi

    from ckptinspect.sources.hub import hub_endpoint

    endpoint = hub_endpoint(endpoint)
    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - mapped to one line below
        raise _hub_error(exc, where) from None
    sizes = {s.rfilename: s.size for s in info.siblings or ()}
    names = sorted(sizes)
    chosen, files, sets = select_set(names, tag, where=where)
    reader = _RangeReader(repo_id, info.sha or revision, endpoint, token, where)
    parts = [(name, reader.header(name, sizes.get(name))) for name in files]
    check_split(parts, where=f"{where}/{chosen}")
    heads = [(name, reader.header(name, sizes.get(name))) for name in companions_for(names, chosen)]
    stats = {"requests": reader.requests + 1, "bytes_received": reader.received,
             "header_bytes": sum(h.header_bytes for _, h in parts + heads), "files_read": len(parts) + len(heads)}
    return RawGguf(ref=ref, kind="hub", location=f"{endpoint}/{repo_id}", files=tuple(names), model=chosen,
                   parts=tuple(parts), companions=tuple(heads), model_sets=sets, revision=info.sha or revision,
                   stats=stats)


class _RangeReader:
    def __init__(self, repo_id: str, revision: str | None, endpoint: str, token: str | None, where: str) -> None:
        self.repo_id, self.revision, self.endpoint, self.token, self.where = repo_id, revision, endpoint, token, where
        self.requests = 0
        self.received = 0

    def header(self, name: str, size: int | None) -> GgufHeader:
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(self.repo_id, name, revision=self.revision, endpoint=self.endpoint)
        source = f"{self.where}/{name}"
        first = self._range(url, 0, FIRST_RANGE if size is None else min(FIRST_RANGE, size), source)
        return parse_gguf(ByteWindow(first, source=source, file_size=size,
                                     extend=lambda start, stop: self._range(url, start, stop, source)))

    def _range(self, url: str, start: int, stop: int, source: str) -> bytes:
        if stop <= start:
            return b""
        last: Exception | None = None
        for attempt in range(ATTEMPTS):
            try:
                return self._get(url, start, stop, source)
            except (NetworkError,) as exc:
                last = exc
                time.sleep(0.2 * (attempt + 1))
        assert last is not None
        raise last

    def _get(self, url: str, start: int, stop: int, source: str) -> bytes:
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = build_hf_headers(token=self.token)
        headers["Range"] = f"bytes={start}-{stop - 1}"
        self.requests += 1
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S) as resp:
                if resp.status_code >= 500 or resp.status_code == 429:
                    raise NetworkError(f"HTTP {resp.status_code} reading bytes {start:,}-{stop - 1:,}", path=source)
                try:
                    hf_raise_for_status(resp)
                except Exception as exc:  # noqa: BLE001
                    raise _hub_error(exc, source) from None
                if resp.status_code != 206:
                    raise SourceError(f"the server answered {resp.status_code} to a range request (ranges are "
                                      "required: tensor data is never downloaded)", path=source)
                content_range = resp.headers.get("Content-Range", "")
                if not content_range.startswith(f"bytes {start}-"):
                    raise SourceError(f"asked for bytes {start:,}-{stop - 1:,}, got '{content_range}'", path=source)
                chunks, got = [], 0
                for chunk in resp.iter_bytes():
                    chunks.append(chunk)
                    got += len(chunk)
                    if got >= stop - start:
                        break
                self.received += got
                return b"".join(chunks)[: stop - start]
        except (HeaderError, SourceError):
            raise
        except Exception as exc:  # noqa: BLE001 - the client's own transport errors, matched by class name
            # huggingface_hub's client is httpx(2): its TimeoutException / TransportError, whichever package
            # provides them, are what a dropped or slow connection raises.
            names = {c.__name__ for c in type(exc).__mro__}
            if "TimeoutException" in names:
                raise NetworkError(f"timed out reading bytes {start:,}-{stop - 1:,}", path=source) from None
            if "TransportError" in names or isinstance(exc, OSError):
                raise NetworkError(f"connection failed ({type(exc).__name__})", path=source) from None
            raise


def _hub_error(exc: Exception, where: str) -> Exception:
    """One-line error for what huggingface_hub raised (its exception classes, by name)."""
    if isinstance(exc, (HeaderError, SourceError)):
        return exc
    kind = type(exc).__name__
    if kind in ("GatedRepoError",):
        return AccessError("gated repo: accept its terms on the Hub and pass a token (--token / HF_TOKEN)", path=where)
    if kind in ("RepositoryNotFoundError",):
        return NotFoundError("repo not found (or private: pass a token)", path=where)
    if kind in ("RevisionNotFoundError",):
        return NotFoundError("revision not found", path=where)
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return NotFoundError("file not found in the repo", path=where)
    status: Any = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return AccessError(f"access denied (HTTP {status})", path=where)
    first = str(exc).splitlines()[0] if str(exc) else kind
    return NetworkError(f"Hub request failed: {first}", path=where)
