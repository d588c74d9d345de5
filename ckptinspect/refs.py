"""Model references as people type them, normalised before any source opens them.

- ``https://huggingface.co/org/name`` (also ``hf.co``, no scheme as Ollama's ``hf.co/org/name:TAG``,
  ``/tree/REV``, ``/blob/REV/...``, ``/resolve/REV/...``, ``/commit/SHA``) and ``hf://org/name[@REV]``
  (huggingface_hub's HfFileSystem form) -> ``org/name[:TAG][@REV]``; a link to one ``.gguf`` file keeps
  the choice of quant as llama.cpp's ``:TAG``; dataset and Space URLs are an error;
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

# The Hub's web hosts (any scheme, or none: "hf.co/org/name:Q4_K_M" is how Ollama names a GGUF repo) and
# huggingface_hub's HfFileSystem scheme.
_HUB_PREFIX = re.compile(r"^(?:(?P<scheme>https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/|(?P<fs>hf://))",
                         re.IGNORECASE)
_NAME = re.compile(r"[\w.-]+")
# Web pages whose next path segment is a revision (quoted: "refs%2Fpr%2F1").
_REV_PAGES = ("tree", "blob", "resolve", "commit", "commits", "raw")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def normalize_ref(ref: str, revision: str | None = None) -> tuple[str, str | None]:
    """(reference a source understands, revision); see the module docstring."""
    ref = _hub_url_ref(ref.strip()) or ref
    ref = _cache_folder(ref)
    if ref.endswith("/") and len(ref) > 1 and not Path(ref).expanduser().exists():
        # a trailing slash from tab completion (a directory of that name elsewhere, or a repo id typed
        # after one): the repo id without it
        ref = ref.rstrip("/") or ref
    repo, at, pinned = ref.partition("@")
    if at and revision is not None and pinned != revision and not Path(ref).exists():
        raise SourceError(f"the reference pins revision {pinned!r} but --revision says {revision!r}",
                          path=ref, hint="give the revision once")
    return ref, revision


def _hub_url_ref(ref: str) -> str | None:
    """``org/name[:TAG][@REV]`` for a Hub URL, None for anything else (a path that exists stays a path)."""
    from urllib.parse import unquote

    match = _HUB_PREFIX.match(ref)
    if match is None or (not (match.group("scheme") or match.group("fs")) and Path(ref).expanduser().exists()):
        return None
    parts = [p for p in re.split(r"[?#]", ref[match.end():], maxsplit=1)[0].split("/") if p]
    if parts and parts[0] in ("datasets", "spaces"):
        raise SourceError(f"is a Hub {parts[0][:-1]}, not a model repo", path=ref,
                          hint="pass a model's URL or org/name")
    if parts and parts[0] == "models":
        parts = parts[1:]
    if len(parts) < 2:
        raise SourceError("a Hub URL names a repo as org/name", path=ref)
    name, _, pinned = parts[1].partition("@")  # hf://org/name@REV/path
    name, _, tag = name.partition(":")  # hf.co/org/name:TAG
    rev, file = unquote(pinned) or None, "/".join(parts[2:])
    if len(parts) > 3 and parts[2] in _REV_PAGES and not match.group("fs"):
        url_rev, file = unquote(parts[3]), "/".join(parts[4:])
        if rev is not None and url_rev != rev:
            raise SourceError(f"the URL names two revisions ({rev!r} and {url_rev!r})", path=ref)
        rev = url_rev
    elif not match.group("fs"):
        file = ""  # another page of the repo (discussions, settings): the repo itself
    if not (_NAME.fullmatch(parts[0]) and _NAME.fullmatch(name) and (not tag or _NAME.fullmatch(tag))):
        raise SourceError("is not a Hub model URL (org/name of letters, digits, '-', '_', '.')", path=ref)
    if file.lower().endswith(".gguf"):  # a link to one quant: keep which one, as llama.cpp's :TAG
        from ckptinspect.sources.gguf_files import set_name

        tag = tag or set_name(file.rsplit("/", 1)[-1])
    return f"{parts[0]}/{name}" + (f":{tag}" if tag else "") + (f"@{rev}" if rev and rev != "main" else "")


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
