"""`ckptinspect rules validate`: rule files and directories checked the way the report would load them.

Family files are schema-checked and resolved with the built-ins; engine, GPU and other plan rule files
against their own schemas (rules/schema/). The library entry point is ``ckptinspect.api.validate_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ckptinspect.errors import RuleError
from ckptinspect.readiness.loader import load_rules, read_rule_file, rule_files
from ckptinspect.rules.documents import load_rule_document, plan_rule_schema


@dataclass(frozen=True)
class RuleFileCheck:
    """One outcome of ``validate_rules``: ``path`` passed (error None) or the one-line error."""

    path: str
    error: str | None


def validate_rule_files(paths: Sequence[Path], rules_dirs: Sequence[Path] = ()) -> list[RuleFileCheck]:
    """Check rule files or directories of them, in order.

    A family file is checked against the family schema and resolved together with the built-ins and
    ``rules_dirs`` (unknown ``extends``, colliding claims, missing engine sections); a directory is
    schema-checked file by file, then resolved as a whole (its files may extend each other), and its
    files pass only when both hold. An engine (``kind: engine`` / ``common``) or GPU catalog file, or a
    directory of only such files (rules/engines/), is checked against its own schema.
    """
    out: list[RuleFileCheck] = []

    def passes(where: Path, action: Any) -> bool:
        try:
            action()
        except RuleError as exc:
            out.append(RuleFileCheck(str(where), str(exc)))
            return False
        return True

    for path in paths:
        path = Path(path)
        if path.is_dir():
            files = rule_files(path)
            schemas = {f: _plan_schema_or_none(f) for f in files}
            if files and all(schemas.values()):  # a directory of engine / GPU files (rules/engines/)
                out += [RuleFileCheck(str(f), None) for f in files
                        if passes(f, lambda f=f: load_rule_document(f, schemas[f]))]
                continue
            good = [f for f in files if passes(f, lambda f=f: read_rule_file(f))]
            if len(good) == len(files) and passes(path, lambda: load_rules((*rules_dirs, path))):
                out += [RuleFileCheck(str(f), None) for f in files]
            continue
        found: list[str | None] = []
        if not passes(path, lambda: found.append(plan_rule_schema(path))):
            continue
        schema = found[0]
        if schema is not None:
            if passes(path, lambda: load_rule_document(path, schema)):
                out.append(RuleFileCheck(str(path), None))
        elif passes(path, lambda: read_rule_file(path)) and \
                passes(path, lambda: load_rules(rules_dirs, extra_files=[path])):
            out.append(RuleFileCheck(str(path), None))
    return out


def _plan_schema_or_none(path: Path) -> str | None:
    try:
        return plan_rule_schema(path)
    except RuleError:
        return None  # unreadable: the family checks that follow report the error, once
