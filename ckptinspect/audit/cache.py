"""The audit cache: a repo's report document kept by commit, so a re-run reads only what changed.

A cached report is used only when everything that decides the report is the same: the repo, the commit
its ``main`` points to now, the ckptinspect code and rule files (a hash of their bytes, so an edited
rule or a new version never reuses an old answer) and the report options (GPU, count, context,
engine). What is read back is checked before it is believed: an HMAC-SHA256 over the whole entry under
the per-user key of ckptinspect/cache_auth.py (kept outside the cache directory: a checksum anyone can
recompute let an edited report flip ``audit --fail-on``, issue 36), the key, repo and commit it was
stored under, and the report JSON schema. The file is read through the guarded reader (a regular file of
at most ``MAX_ENTRY_BYTES``, bounded JSON), so a FIFO, a device or a 4 GiB entry is a miss too, not a
hang or a MemoryError. Anything else is a miss and the repo is read again: a cache can cost time,
never change an answer. Without a usable key nothing is read or stored.

Files live in ``audit/`` under the settings' cache directory (``$CKPTINSPECT_CACHE_DIR``, default
``$XDG_CACHE_HOME/ckptinspect`` or ``~/.cache/ckptinspect``: ckptinspect/settings.py), one per repo and
key, written atomically (temporary file + rename).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from ckptinspect.cache_auth import mac, verify
from ckptinspect.cache_auth import cache_key as user_key
from ckptinspect.errors import CkptInspectError
from ckptinspect.guarded_file import read_json

CACHE_VERSION = 2  # 1: sha256-checked entries, never trusted again
# A report document of the largest known checkpoint is well under 1 MB; an entry larger than this is
# refused before it is read.
MAX_ENTRY_BYTES = 16 * 1024 * 1024


def cache_root(cache_dir: Path | None) -> Path | None:
    """``audit/`` under the tool's cache directory (``Settings.cache_dir``); None: no cache."""
    return None if cache_dir is None else cache_dir / "audit"


def code_fingerprint(rules_dirs: Sequence[Path] = ()) -> str:
    """sha256 over the package's code and data files, the built-in rules and ``rules_dirs``."""
    import ckptinspect
    from ckptinspect.rules.documents import rules_root

    from ckptinspect.errors import RuleError
    from ckptinspect.guarded_file import read_bytes
    from ckptinspect.safe_yaml import MAX_RULE_FILE_BYTES

    digest = hashlib.sha256()
    roots = [Path(ckptinspect.__file__).resolve().parent, rules_root(), *(Path(d) for d in rules_dirs)]
    for n, root in enumerate(roots):
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".json"))
        for path in files:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            # a --rules-dir file is the user's: the guarded reader and the rule-file cap (a sparse 4 GiB
            # "rules.yaml" is one error line, not a MemoryError); the package's own files are ours
            data = read_bytes(path, what="rule file", cap=MAX_RULE_FILE_BYTES, error=RuleError) if n >= 2 \
                else path.read_bytes()
            digest.update(data + b"\0")
    return digest.hexdigest()


def cache_key(repo_id: str, sha: str, fingerprint: str, options: Mapping[str, Any]) -> str:
    text = json.dumps({"v": CACHE_VERSION, "repo": repo_id, "sha": sha, "code": fingerprint,
                       "options": dict(options)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class AuditCache:
    """Report documents by (repo, commit, code, options); ``root`` None: no cache."""

    def __init__(self, root: Path | None, fingerprint: str, options: Mapping[str, Any],
                 key_file: Path | None = None) -> None:
        self.root = root
        self.key_file = key_file  # the per-user MAC key (Settings.cache_key_file); None: no lookups, no stores
        self.fingerprint = fingerprint
        self.options = dict(options)
        self._secret: bytes | None | bool = False  # False: not looked up yet

    def secret(self) -> bytes | None:
        if self._secret is False:
            self._secret = None if self.root is None else user_key(self.root, self.key_file, self.root.parent)
        return self._secret  # type: ignore[return-value]

    def _path(self, repo_id: str) -> Path:
        assert self.root is not None
        name = hashlib.sha256(repo_id.encode()).hexdigest()[:32]  # a repo id is not a safe file name
        return self.root / f"{name}.json"

    def has_repo(self, repo_id: str) -> bool:
        return self.root is not None and self.secret() is not None and self._path(repo_id).is_file()

    def get(self, repo_id: str, sha: str | None) -> dict[str, Any] | None:
        """The stored report of ``repo_id`` at ``sha`` under this code and these options, if it checks out."""
        if self.root is None or not sha:
            return None
        secret = self.secret()
        if secret is None:
            return None
        try:
            entry = read_json(self._path(repo_id), what="audit cache entry", cap=MAX_ENTRY_BYTES)
        except CkptInspectError:
            return None
        key = cache_key(repo_id, sha, self.fingerprint, self.options)
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("repo") != repo_id \
                or entry.get("sha") != sha or not isinstance(entry.get("doc"), dict) \
                or not isinstance(entry.get("mac"), str):
            return None
        doc = entry["doc"]
        try:
            tag = base64.b64decode(entry["mac"], validate=True)
            if not verify(secret, tag, _canonical(key), _canonical(doc)):
                return None
        except (ValueError, TypeError):
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
        secret = self.secret()
        if secret is None:
            return
        path = self._path(repo_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            key = cache_key(repo_id, sha, self.fingerprint, self.options)
            tag = mac(secret, _canonical(key), _canonical(doc))
            entry = {"key": key, "repo": repo_id, "sha": sha, "mac": base64.b64encode(tag).decode("ascii"),
                     "doc": doc}
            text = json.dumps(entry)
            if len(text) > MAX_ENTRY_BYTES:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError):
            pass
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass


def _canonical(value: Any) -> bytes:
    """The bytes the MAC covers: one JSON spelling of ``value`` (what is read back must equal what was
    stored, whatever the file's own spacing or key order)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")
