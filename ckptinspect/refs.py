"""Model references as people type them, normalised before any source opens them.

- ``https://huggingface.co/org/name`` (also ``/tree/REV``, ``/blob/REV/...``, ``/resolve/REV/...``) and
  ``hf://org/name`` -> ``org/name`` (with the revision the URL names);
- an HF cache repo folder ``.../models--org--name`` or its ``snapshots/`` folder -> the snapshot
  directory ``refs/main`` points to (or the only one there), read like any local directory;
- ``org/name@rev`` with a different ``--revision``: an error, not a silent choice.

Only the shape of the string and the cache folder's own ``refs/main`` (through the guarded reader)
are looked at; nothing is fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptinspect.errors import NotFoundError, SourceError

_HUB_URL = re.compile(r"^(?:https?://(?:www\.)?huggingface\.co/|hf://)(?:models/)?"
                      r"(?P<repo>[\w.-]+/[\w.-]+)(?P<at>@[^/?#]+)?(?:/(?:tree|blob|resolve)/(?P<rev>[^/?#]+))?"
                      r"[^?#]*(?:[?#].*)?$")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def normalize_ref(ref: str, revision: str | None = None) -> tuple[str, str | None]:
    """(reference a source understands, revision); see the module docstring."""
    match = _HUB_URL.match(ref.strip())
    if match:
        ref, url_rev = match.group("repo"), match.group("rev") or (match.group("at") or "")[1:]
        if url_rev and url_rev != "main":
            ref = f"{ref}@{url_rev}"
    ref = _cache_folder(ref)
    repo, at, pinned = ref.partition("@")
    if at and revision is not None and pinned != revision and not Path(ref).exists():
        raise SourceError(f"the reference pins revision {pinned!r} but --revision says {revision!r}",
                          path=ref, hint="give the revision once")
    return ref, revision


def _cache_folder(ref: str) -> str:
    path = Path(ref).expanduser()
    folder = path.parent if path.name == "snapshots" else path
    if not (folder.name.startswith("models--") and (folder / "snapshots").is_dir()):
        return ref
    snapshots = folder / "snapshots"
    commit = None
    if (folder / "refs" / "main").is_file():
        from ckptinspect.guarded_file import MAX_REF_BYTES, read_text

        commit = read_text(folder / "refs" / "main", what="HF cache ref", cap=MAX_REF_BYTES,
                           error=SourceError).strip()
    if commit and _COMMIT.fullmatch(commit) and (snapshots / commit).is_dir():
        return str(snapshots / commit)
    found = sorted(p.name for p in snapshots.iterdir() if p.is_dir())
    if len(found) == 1:
        return str(snapshots / found[0])
    raise NotFoundError(f"HF cache repo folder with {len(found)} snapshots and no refs/main to choose one "
                        f"({', '.join(found[:3]) or 'none'})", path=ref,
                        hint=f"pass {snapshots}/COMMIT or the repo id {folder.name[8:].replace('--', '/', 1)}")


def looks_like_repo_id(ref: str) -> bool:
    """``org/name`` (one slash, no path syntax): a Hub repo id, or a mistyped relative path."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+(?:@[^/\s]+)?", ref)) and not ref.startswith((".", "/"))


# Files that live inside a model directory: naming one means the directory was meant.
_MODEL_DIR_FILES = ("config.json", "hf_quant_config.json", "model.safetensors.index.json",
                    "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def check_ref(ref: str) -> str:
    """Reject references that can only be a mistake, before any source is opened.

    An empty string (an unset shell variable) is never "the bundled example"; a file inside a model
    directory (``path/config.json``, a ``.safetensors`` shard) names the directory to pass instead.
    """
    if not ref.strip():
        raise NotFoundError("empty model reference (an unset shell variable?); pass a directory, org/name "
                            "or a .json.gz snapshot, or no argument at all for the bundled example",
                            path=repr(ref))
    path = Path(ref).expanduser()
    if path.is_file() and not ref.endswith(".json.gz"):
        name = path.name
        if name in _MODEL_DIR_FILES or name.endswith((".safetensors", ".safetensors.index.json")):
            parent = str(path.parent) or "."
            raise NotFoundError(f"is a file inside a model directory; pass the directory instead: {parent}",
                                path=ref)
    return ref
