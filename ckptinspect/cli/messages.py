"""The one line the CLI prints for a library error, with what a user needs to act on it.

Network errors name the endpoint and the underlying cause; offline errors (HF_HUB_OFFLINE=1) say what
the HF cache holds for the repo and point to `ckptinspect snapshot`: huggingface_hub caches only the
files it downloaded, so shard *headers* are in the cache only when the whole shards are.
"""

from __future__ import annotations

import re

from ckptinspect.errors import CkptInspectError, GgufQuantChoice, NetworkError, NotFoundError
from ckptinspect.settings import Settings

SNAPSHOT_HINT = ("shard headers are in the HF cache only when the whole shards were downloaded; on a machine "
                 "with network run `ckptinspect snapshot {repo} -o {name}.json.gz`, then report that file")


# The phrasings the Hub sources give a repo the Hub does not show (sources/repo_info.py, gguf_hub.py)
# and the one hint a user needs for it: a typo, a private repo or a gated one.
_REPO_NOT_FOUND = re.compile(r"(repository|repo) not found(?: \(or private: pass (?:--token|a token)\))?")
REPO_NOT_FOUND_HINT = ("not found, private or gated? check the spelling; a private or gated repo needs --token "
                       "or HF_TOKEN")
# huggingface_hub appends a documentation link to some HTTP errors ("... see https://...", "For more
# details, see https://..."): the one line keeps the status and the cause, not the link.
_DOC_LINK = re.compile(r"[\s.;,]*(?:\\n)*\s*(?:for more details, )?see https?://\S+\s*$", re.IGNORECASE)


def explain(exc: CkptInspectError, settings: Settings | None = None) -> str:
    """``exc``'s line; ``settings``: the command's (the endpoint a network error names)."""
    text = _DOC_LINK.sub("", str(exc))
    if isinstance(exc, NotFoundError) and not isinstance(exc, GgufQuantChoice) and _REPO_NOT_FOUND.search(text):
        return _REPO_NOT_FOUND.sub(REPO_NOT_FOUND_HINT, text, count=1)
    if isinstance(exc, NetworkError):
        return _network(exc, text, settings or Settings())
    if isinstance(exc, NotFoundError) and "HF_HUB_OFFLINE" in text and exc.path:
        # The source's generic hint ("run once online") is replaced by what the cache holds and the
        # one command that helps (a Hub read caches the JSON files, never the shard headers).
        if exc.hint and text.endswith(f" ({exc.hint})"):
            text = text[: -len(f" ({exc.hint})")]
        return _offline(exc.path, text)
    return text


def _root_cause(exc: BaseException) -> BaseException | None:
    """The innermost exception the library error was raised from (kept as __context__ under `from None`)."""
    seen: set[int] = set()
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        deeper = cause.__cause__ or cause.__context__
        if deeper is None:
            break
        cause = deeper
    return cause


def _network(exc: NetworkError, text: str, settings: Settings) -> str:
    from ckptinspect.api import hub_endpoint

    extra = []
    endpoint = hub_endpoint(settings)  # without HF_ENDPOINT's userinfo
    if "://" not in text:
        extra.append(f"endpoint {endpoint} (HF_ENDPOINT)")
    cause = _root_cause(exc)
    # A cause worth adding is a transport error the message does not already name (the Hub source
    # names it in most messages; an inner library error only repeats the message).
    if cause is not None and not isinstance(cause, CkptInspectError) and type(cause).__name__ not in text:
        import re

        from ckptinspect.render.terminal import escape_controls

        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        # A library's text may quote what a server sent (terminal control) or a URL with its password.
        detail = escape_controls(re.sub(r"://[^/?#\s@]*@", "://", " ".join(detail.split())))
        extra.append(f"cause: {detail[:300]}")
    return text + (f" [{'; '.join(extra)}]" if extra else "")


def _offline(ref: str, text: str) -> str:
    from ckptinspect.api import cached_files

    repo_id, cache_dir, files = cached_files(ref)
    if files:
        shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
        cached = f"the HF cache at {cache_dir} holds for {repo_id}: {shown}"
    else:
        cached = f"the HF cache at {cache_dir} holds nothing for {repo_id}"
    hint = SNAPSHOT_HINT.format(repo=ref, name=repo_id.replace("/", "--"))
    return f"{text}; {cached}; {hint}"
