"""The audit cache: a repo's report document kept by commit, so a re-run reads only what changed.

A cached report is used only when everything that decides the report is the same: the repo, the commit
its ``main`` points to now, the ckptinspect code and rule files (a hash of their bytes, so an edited
rule or a new version never reuses an old answer) and the report options (GPU, count, context,
engine). What is read back is checked before it is believed: the file's own checksum over the document,
the key, repo and commit it was stored under, and the report JSON schema. Anything else is a miss and
the repo is read again: a cache can cost time, never change an answer.

Files live in ``audit/`` under the settings' cache directory (``$CKPTINSPECT_CACHE_DIR``, default
``$XDG_CACHE_HOME/ckptinspect`` or ``~/.cache/ckptinspect``: ckptinspect/settings.py), one per repo and
key, written atomically (temporary file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

CACHE_VERSION = 1


def cache_root(cache_dir: Path | None) -> Path | None:
    """``audit/`` under the tool's cache directory (``Settings.cache_dir``); None: no cache."""
    return None if cache_dir is None else cache_dir / "audit"


def code_fingerprint(rules_dirs: Sequence[Path] = ()) -> str:
    """sha256 over the package's code and data files, the built-in rules and ``rules_dirs``."""
    import ckptinspect
    from ckptinspect.rules.documents import rules_root

    digest = hashlib.sha256()
    roots = [Path(ckptinspect.__file__).resolve().parent, rules_root(), *(Path(d) for d in rules_dirs)]
    for root in roots:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".json"))
        for path in files:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_key(repo_id: str, sha: str, fingerprint: str, options: Mapping[str, Any]) -> str:
    text = json.dumps({"v": CACHE_VERSION, "repo": repo_id, "sha": sha, "code": fingerprint,
                       "options": dict(options)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class AuditCache:
    """Report documents by (repo, commit, code, options); ``root`` None: no cache."""

    def __init__(self, root: Path | None, fingerprint: str, options: Mapping[str, Any]) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self.options = dict(options)

    def _path(self, repo_id: str) -> Path:
        assert self.root is not None
        name = hashlib.sha256(repo_id.encode()).hexdigest()[:32]  # a repo id is not a safe file name
        return self.root / f"{name}.json"

    def has_repo(self, repo_id: str) -> bool:
        return self.root is not None and self._path(repo_id).is_file()

    def get(self, repo_id: str, sha: str | None) -> dict[str, Any] | None:
        """The stored report of ``repo_id`` at ``sha`` under this code and these options, if it checks out."""
        if self.root is None or not sha:
            return None
        try:
            entry = json.loads(self._path(repo_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        key = cache_key(repo_id, sha, self.fingerprint, self.options)
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("repo") != repo_id \
                or entry.get("sha") != sha or not isinstance(entry.get("doc"), dict):
            return None
        doc = entry["doc"]
        if entry.get("checksum") != _checksum(doc):
            return None
        source = doc.get("source")
        if not isinstance(source, dict) or source.get("revision") != sha or source.get("ref") != repo_id:
            return None
        try:
            from ckptinspect.render.json_out import validate_report_json

            validate_report_json(doc)
        except Exception:  # noqa: BLE001 - jsonschema's ValidationError / SchemaError: not a report any more
            return None
        return doc

    def put(self, repo_id: str, doc: Mapping[str, Any]) -> None:
        """Store ``doc`` (a report of ``repo_id`` at ``doc.source.revision``); failures only cost time."""
        sha = (doc.get("source") or {}).get("revision")
        if self.root is None or not sha:
            return
        entry = {"key": cache_key(repo_id, sha, self.fingerprint, self.options), "repo": repo_id, "sha": sha,
                 "checksum": _checksum(doc), "doc": doc}
        path = self._path(repo_id)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entry), encoding="utf-8")
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError):
            try:
                tmp.unlink()
            except OSError:
                pass


def _checksum(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
