"""GGUF file sets: which files of a directory or repo form the model, which are its companions.

Naming conventions (llama.cpp tools/gguf-split/gguf-split.cpp ``split_path`` and
``llama_split_prefix``): a split set is ``<stem>-00001-of-0000N.gguf`` ... every part carrying
``split.no`` / ``split.count`` / ``split.tensors.count`` (gguf-py constants.py ``Keys.Split``).
Repos that ship several quants hold one set per quant, often in a folder per quant
(``UD-Q4_K_XL/...``). A quant is picked with llama.cpp's ``-hf org/repo:TAG`` syntax: the sets whose
name contains TAG (case-insensitive). MTP heads shipped apart from the trunk are GGUF files whose
name carries an ``mtp`` token (``mtp-<model>-Q8_0.gguf``, ``MTP/<model>-Q4_0-MTP.gguf``); vision
projectors (``mmproj*``) are neither the model nor a head.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ckptinspect.errors import ConfigError, GgufQuantChoice, HeaderError, NotFoundError
from ckptinspect.header.gguf import GgufHeader

SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_TOKENS = re.compile(r"[-_./ ]+")
MAX_SPLIT_PARTS = 10_000


@dataclass(frozen=True)
class RawGguf:
    """What a GGUF source delivers: the selected model's parsed headers, and its companions'."""

    ref: str
    kind: str  # local | hf-cache | hub
    location: str
    files: tuple[str, ...]  # every file of the directory / repo (relative)
    model: str  # the selected model set (its stem)
    parts: tuple[tuple[str, GgufHeader], ...]  # (file, header) in split order
    companions: tuple[tuple[str, GgufHeader], ...]  # MTP head files next to the model
    model_sets: tuple[str, ...]  # every model set found (for "pick one of" messages)
    revision: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    format: str = "gguf"


def is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


def is_projector(name: str) -> bool:
    return name.rsplit("/", 1)[-1].lower().startswith("mmproj")


def is_companion(name: str) -> bool:
    """A separately shipped MTP head: an ``mtp`` token in its file or folder name."""
    return "mtp" in (t.lower() for t in _TOKENS.split(name[:-5] if is_gguf(name) else name))


def set_name(name: str) -> str:
    """The model set a file belongs to: the path without the split suffix or the extension."""
    m = SPLIT.match(name)
    return m.group("stem") if m else name[:-5]


def model_sets(names: list[str]) -> dict[str, list[str]]:
    """set name -> its files (split order) among ``names``: GGUF files that are neither heads nor projectors."""
    sets: dict[str, list[str]] = {}
    for name in sorted(names):
        if is_gguf(name) and not is_projector(name) and not is_companion(name):
            sets.setdefault(set_name(name), []).append(name)
    if not sets:  # a repo of MTP-named models only (e.g. "<model>-MTP-Q4_K_M.gguf"): those are the models
        for name in sorted(names):
            if is_gguf(name) and not is_projector(name):
                sets.setdefault(set_name(name), []).append(name)
    return sets


def select_set(names: list[str], tag: str | None, *, where: str) -> tuple[str, list[str], tuple[str, ...]]:
    """(set name, its files, all set names) for the quant ``tag`` (None: the only set there is)."""
    sets = model_sets(names)
    if not sets:
        raise NotFoundError("holds no GGUF model file", path=where)
    names_all = tuple(sets)
    if tag is None:
        if len(sets) > 1:
            raise GgufQuantChoice(f"holds {len(sets)} GGUF models; pick one with :TAG "
                                  f"({', '.join(_short(s) for s in names_all[:8])})", models=names_all, path=where)
        chosen = names_all[0]
    else:
        hits = [s for s in sets if tag.lower() in s.lower()]
        exact = [s for s in hits if s.lower().endswith(tag.lower())]
        hits = exact if len(exact) == 1 else hits
        if len(hits) != 1:
            what = "no" if not hits else f"{len(hits)}"
            raise NotFoundError(f"{what} GGUF model matches :{tag} "
                                f"(models: {', '.join(_short(s) for s in (hits or list(names_all))[:8])})", path=where)
        chosen = hits[0]
    return chosen, sets[chosen], names_all


def quant_tag(names: list[str], model: str) -> str | None:
    """The ``:TAG`` that selects the set ``model`` among ``names`` (its file name), or None when that name
    would select another set too (the same file name in two folders)."""
    tag = _short(model)
    try:
        return tag if select_set(names, tag, where="")[0] == model else None
    except NotFoundError:
        return None


def companions_for(names: list[str], chosen: str) -> list[str]:
    """MTP head files shipped with the chosen set, nearest first: in its folder, in an ``MTP`` folder next
    to it, then at the top of the repo (a quant folder's model with one head file for all quants)."""
    folder = chosen.rsplit("/", 1)[0] if "/" in chosen else ""
    places = [folder, f"{folder}/mtp" if folder else "mtp", "", "mtp"]
    found: list[tuple[int, str]] = []
    for name in sorted(names):
        if not is_gguf(name) or not is_companion(name) or set_name(name) == chosen:
            continue
        parent = (name.rsplit("/", 1)[0] if "/" in name else "").lower()
        rank = next((i for i, place in enumerate(places) if parent == place.lower()), None)
        if rank is not None:
            found.append((rank, name))
    return [name for _, name in sorted(found)]


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def check_split(parts: list[tuple[str, GgufHeader]], *, where: str) -> None:
    """A split set is complete and consistent: parts 1..N present, split keys agree, each tensor once."""
    if len(parts) == 1 and "split.count" not in parts[0][1].metadata:
        return
    count = parts[0][1].metadata.get("split.count")
    if not isinstance(count, int) or not 1 <= count <= MAX_SPLIT_PARTS:
        raise HeaderError(f"split.count is {count!r}", path=parts[0][0])
    if len(parts) != count:
        present = {p[1].metadata.get("split.no") for p in parts}
        missing = [i + 1 for i in range(count) if i not in present][:3]
        raise NotFoundError(f"split set has {len(parts)} of {count} parts (missing part(s) "
                            f"{', '.join(f'{m:05d}' for m in missing)})", path=where)
    seen: set[str] = set()
    for i, (name, header) in enumerate(parts):
        if header.metadata.get("split.no") != i or header.metadata.get("split.count") != count:
            raise HeaderError(f"split.no / split.count say {header.metadata.get('split.no')!r} of "
                              f"{header.metadata.get('split.count')!r}, expected {i} of {count}", path=name)
        for t in header.tensors:
            if t.name in seen:
                raise HeaderError(f"tensor '{t.name}' is also in an earlier part", path=name)
            seen.add(t.name)
    declared = parts[0][1].metadata.get("split.tensors.count")
    if declared is not None and declared != len(seen):
        raise ConfigError(f"split.tensors.count says {declared:,} tensors, the parts hold {len(seen):,}",
                          path=parts[0][0])


TAGGED_REF = re.compile(r"^(?P<repo>[\w.\-]+/[\w.\-]+)(?::(?P<tag>[\w.\-]+))?(?:@(?P<rev>[\w.\-/]+))?$")
