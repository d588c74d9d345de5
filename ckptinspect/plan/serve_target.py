"""What a launch command names as the model: the path or repo id the engine can load, and a revision.

A plan of a local directory serves that directory; a plan of a Hub repo (read online or from the HF
cache) serves the repo id, with ``--revision`` when the user pinned one (``org/name@rev`` is not a name
either engine resolves: both take the revision as its own flag). A plan of a ``.json.gz`` snapshot
serves what the snapshot was taken of (its recorded ``source``): the snapshot file holds headers, not
weights, so neither engine can load it, and the recorded commit pins the weights the plan was sized for.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ckptinspect.records import Checkpoint

_COMMIT = re.compile(r"[0-9a-f]{40}")


def serve_target(ck: Checkpoint) -> tuple[str, str | None]:
    """(``--model-path`` value, ``--revision`` value or None) for ``ck``."""
    if ck.kind == "local":
        return ck.location, None
    if ck.kind == "snapshot":
        source = ck.stats.get("snapshot_of")
        if isinstance(source, Mapping):
            return _recorded(source, ck.location)
        return ck.location, None
    repo, revision = _split(ck.ref)
    return repo, revision


def _recorded(source: Mapping[str, Any], fallback: str) -> tuple[str, str | None]:
    kind, ref, location = source.get("kind"), source.get("ref"), source.get("location")
    if kind == "local" and isinstance(location, str) and location:
        return location, None
    if kind in ("hub", "hf-cache") and isinstance(ref, str) and ref:
        repo, asked = _split(ref)
        recorded = source.get("revision")
        pinned = recorded if isinstance(recorded, str) and _COMMIT.fullmatch(recorded) else asked
        return repo, pinned
    return fallback, None


def _split(ref: str) -> tuple[str, str | None]:
    repo, _, revision = ref.partition("@")
    return repo, (revision or None)
