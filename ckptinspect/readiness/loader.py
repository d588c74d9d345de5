"""Load, validate and resolve family rule files.

Built-in rules live in ``rules/families`` (``ckptinspect/_rules/families`` in a wheel); every
``--rules-dir`` adds files that override built-ins with the same ``id``. Each file (a regular file of at
most 1 MiB) is parsed by the one safe YAML loader (ckptinspect/safe_yaml.py: no anchors or aliases,
bounded depth); a user's file is validated against ``rules/schema/family.schema.json`` on every run,
the built-ins in CI (tests/test_rules.py), and no validation result is kept between runs. Any error
raises :class:`RuleError` naming the file, the path inside the document and the schema message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from ckptinspect.errors import RuleError
from ckptinspect.inventory.mtp_prefix import check_template
from ckptinspect.readiness.model import (
    DEFAULT_SEVERITY, ENGINES, Check, Defect, DraftAbsent, DraftQuantRule, DraftSubfolder, EngineRule,
    ExpertLayout, FamilyRule, ForcedUnquantized, MtpLayout, Requirement, RuleSet, RuntimeName,
)
from ckptinspect.rules.conditions import names_used
from ckptinspect.rules.documents import FAMILY_SCHEMA, load_rule_document, rules_root, validate_document

def builtin_dir() -> Path:
    return rules_root() / "families"


def read_rule_file(path: Path, *, validate: bool = True) -> dict[str, Any]:
    """Parse one rule file (the one rule loader, ckptinspect/rules/documents.py) and validate it against the family schema.

    ``validate=False`` is for the built-in files only: they ship with the package and are validated
    in CI (tests/test_rule_documents.py), like code, as every built-in rule file is; the run-time cache
    that used to save re-validating them was input the next run trusted (issue 26: a poisoned cache
    changed a verdict). A user's --rules-dir file is always validated."""
    doc = load_rule_document(path, FAMILY_SCHEMA, builtin=True)
    if not isinstance(doc, dict):
        raise RuleError("$: a rule file must be a mapping", path=str(path))
    if validate:
        validate_document(doc, str(path))
    return doc


def rule_files(directory: Path) -> list[Path]:
    """YAML files of a rules directory (``DIR/families`` when it exists, else ``DIR``)."""
    base = directory / "families" if (directory / "families").is_dir() else directory
    if not base.is_dir():
        raise RuleError("rules directory not found", path=str(directory))
    return sorted([*base.glob("*.yaml"), *base.glob("*.yml")])


def load_rules(extra_dirs: Iterable[str | Path] = (), extra_files: Iterable[str | Path] = ()) -> RuleSet:
    """Built-in families plus ``extra_dirs`` (later ones override earlier ones by family id), then
    ``extra_files`` (each its own layer, used by ``rules validate FILE``)."""
    dirs = [builtin_dir(), *(Path(d) for d in extra_dirs)]
    layers = [rule_files(d) for d in dirs] + [[Path(f)] for f in extra_files]
    docs: dict[str, tuple[dict[str, Any], str, int]] = {}
    for origin, paths in enumerate(layers):
        seen: dict[str, str] = {}
        for path in paths:
            doc = read_rule_file(path, validate=origin > 0)  # layer 0: the built-ins, validated in CI
            fid = doc["id"]
            if fid in seen:
                raise RuleError(f"$.id: family {fid!r} is also defined in {seen[fid]}", path=str(path))
            seen[fid] = str(path)
            docs[fid] = (doc, str(path), origin)
    merged = {fid: _resolve(fid, docs, ()) for fid in docs}
    families = tuple(_build(fid, merged[fid], docs[fid][1], docs[fid][2]) for fid in sorted(docs))
    _check_claims(families)
    known = {f.id for f in families}
    for fam in families:
        for sub in fam.draft_subfolders:
            if sub.family not in known:
                raise RuleError(f"$.draft_subfolders: {sub.path}/ names unknown family {sub.family!r}", path=fam.source)
    return RuleSet(families=families, directories=tuple(str(d) for d in dirs))


def _resolve(fid: str, docs: Mapping[str, tuple[dict[str, Any], str, int]], chain: tuple[str, ...]) -> dict[str, Any]:
    doc, path, _ = docs[fid]
    parent_id = doc.get("extends")
    if parent_id is None:
        return doc
    if parent_id not in docs:
        raise RuleError(f"$.extends: unknown family {parent_id!r}", path=path)
    if parent_id in chain or parent_id == fid:
        raise RuleError(f"$.extends: cycle {' -> '.join((*chain, fid, parent_id))}", path=path)
    return merge_documents(_resolve(parent_id, docs, (*chain, fid)), doc)


def _merge_by_code(parent: list[Any], child: list[Any]) -> list[Any]:
    """The child's entries of a code replace the inherited entries of that code; a code may have several
    entries, each for its own ``versions`` range (an engine release that changed the behaviour)."""
    out: dict[str, list[Any]] = {}
    for item in parent:
        out.setdefault(item["code"], []).append(item)
    replaced: set[str] = set()
    for item in child:
        if item["code"] not in replaced:
            out[item["code"]] = []
            replaced.add(item["code"])
        out[item["code"]].append(item)
    return [item for items in out.values() for item in items]


def merge_documents(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Child over parent: sections merge key-wise, defects / checks by ``code``; ``match`` and
    ``abstract`` are never inherited (a child claims its own architectures)."""
    out: dict[str, Any] = {k: v for k, v in parent.items() if k not in ("match", "abstract", "id", "name")}
    for key, value in child.items():
        if key == "mtp" and isinstance(out.get("mtp"), dict):
            out["mtp"] = {**out["mtp"], **value}
        elif key == "checks":
            out["checks"] = _merge_by_code(out.get("checks", []), value)
        elif key == "references":
            out["references"] = [*out.get("references", []), *value]
        elif key == "engines":
            engines = dict(out.get("engines", {}))
            for name, rule in value.items():
                base = dict(engines.get(name, {}))
                for ek, ev in rule.items():
                    base[ek] = _merge_by_code(base.get("defects", []), ev) if ek == "defects" else ev
                engines[name] = base
            out["engines"] = engines
        else:
            out[key] = value
    return out


# Conditions over what is stored only; a defect naming one must also name the per-module facts (what the
# engine builds per MTP module, the report's module table) it rests on (family.schema.json per_module_facts).
STORED_ONLY = frozenset({"partial_quant_in_mtp", "mtp_scheme_is"})


def _condition_keys(when: Any) -> set[str]:
    """Every condition name used in ``when`` (the rules engine walks it: ckptinspect/rules/conditions.py)."""
    return names_used(when)


def per_module_problem(defect: Mapping[str, Any]) -> str:
    """Why a defect breaks the per-module rule, or "": a defect over stored-only conditions names its
    per_module_facts, and each of those holds at the top level of its ``when`` (so the defect cannot
    fire unless the module table says so)."""
    condition = defect.get("when") if isinstance(defect.get("when"), Mapping) else {}
    facts = defect.get("per_module_facts")
    if facts is None:
        stored = sorted(_condition_keys(condition) & STORED_ONLY)
        return (f"uses {', '.join(stored)} (stored facts only) but names no per_module_facts: say which "
                "per-module answer (what the engine builds) the defect depends on") if stored else ""
    missing = [f for f in facts if f not in condition]
    return f"per_module_facts {', '.join(missing)} not a top-level condition of its when" if missing else ""


def _when(raw: Any) -> Mapping[str, Any] | None:
    return dict(raw) if raw is not None else None


def _build(fid: str, doc: Mapping[str, Any], path: str, origin: int) -> FamilyRule:
    mtp_doc = doc.get("mtp", {})
    supported = bool(mtp_doc.get("supported", True))
    abstract = bool(doc.get("abstract", False))
    if supported and not abstract and not (mtp_doc.get("prefixes") and mtp_doc.get("base")):
        raise RuleError("$.mtp: a family with MTP needs 'prefixes' and 'base'", path=path)
    for key in ("prefixes", "base"):  # the grammar, checked here so `rules validate` reports it
        templates = mtp_doc.get(key) or ()
        for i, template in enumerate([templates] if isinstance(templates, str) else templates):
            problem = check_template(template)
            if problem:
                raise RuleError(f"$.mtp.{key}[{i}]: {problem}", path=path)
    experts = mtp_doc.get("experts")
    depth = mtp_doc.get("depth", {})
    layout = MtpLayout(
        supported=supported,
        depth_keys=tuple(depth.get("keys", ())),
        depth_default=int(depth.get("default", 0)),
        depth_note=depth.get("note"),
        prefixes=tuple(mtp_doc.get("prefixes", ())),
        base=mtp_doc.get("base"),
        required=tuple(_requirement(r) for r in mtp_doc.get("required", ())),
        optional=tuple(mtp_doc.get("optional", ())),
        experts=ExpertLayout(
            per_expert=tuple(experts["per_expert"]),
            grouped=tuple(tuple(g) for g in experts.get("grouped", ())),
            count_keys=tuple(experts.get("count_keys", ())),
        ) if experts else None,
        files=tuple(mtp_doc.get("files", ())),
        depth_flag_keys=tuple(depth.get("flag_keys", ())),
    )
    # The per-module rule, like the schema, is checked on a user's files at every load and on the built-in
    # ones in CI (tests/test_verdict_invariant.py walks every built-in defect), not again at every report.
    for name, raw in (doc.get("engines", {}).items() if origin > 0 else ()):
        for i, d in enumerate(raw.get("defects", ()) if isinstance(raw, Mapping) else ()):
            problem = per_module_problem(d)
            if problem:
                raise RuleError(f"$.engines.{name}.defects[{i}] ({d.get('code')}): {problem}", path=path)
    engines = {name: _engine(name, doc["engines"][name]) for name in ENGINES if name in doc.get("engines", {})}
    if not abstract:
        missing = [name for name in ENGINES if name not in engines]
        if missing:
            raise RuleError(f"$.engines: missing engine section(s) {', '.join(missing)}", path=path)
    checks = tuple(
        Check(code=c["code"], when=dict(c["when"]), severity=c.get("severity", "info"), message=c["message"],
              remedy=c.get("remedy"), reference=c.get("reference"))
        for c in doc.get("checks", ())
        if c["code"] not in set(doc.get("drop_checks", ()))
    )
    match = doc.get("match", {})
    return FamilyRule(
        id=fid, name=doc["name"], description=doc.get("description"),
        references=tuple(doc.get("references", ())),
        architectures=tuple(match.get("architectures", ())), model_types=tuple(match.get("model_types", ())),
        abstract=abstract, extends=doc.get("extends"), mtp=layout, checks=checks, engines=engines,
        source=path, origin=origin, document=doc, config_keys=_config_keys(match, path),
        draft_subfolders=_draft_subfolders(doc.get("draft_subfolders", ()), path),
    )


_SUBFOLDER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _draft_subfolders(raw: Any, path: str) -> tuple[DraftSubfolder, ...]:
    """``draft_subfolders`` entries; a name is one path component (never ``..`` or a nested path)."""
    out = []
    for i, entry in enumerate(raw or ()):
        name = entry.get("path") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not _SUBFOLDER.fullmatch(name) or set(name) == {"."}:
            raise RuleError(f"$.draft_subfolders[{i}].path: one folder name ([A-Za-z0-9_.-], not '.'/'..')",
                            path=path)
        absent = {engine: tuple(DraftAbsent(code=a["code"], verdict=a["verdict"], message=a["message"],
                                            reference=a["reference"], versions=a.get("versions"),
                                            remedy=a.get("remedy"))
                                for a in entry.get("absent", {}).get(engine, ()))
                  for engine in ENGINES}
        out.append(DraftSubfolder(path=name, family=str(entry["family"]), reference=str(entry["reference"]),
                                  absent=absent))
    return tuple(out)


def _config_keys(match: Mapping[str, Any], path: str) -> tuple[str, ...]:
    keys = tuple(match.get("config_keys_any", ()))
    if keys and not (match.get("architectures") or match.get("model_types")):
        # keys alone would claim every config that happens to set them, whatever the model
        raise RuleError("$.match.config_keys_any: needs architectures or model_types next to it", path=path)
    return keys


def _requirement(raw: Any) -> Requirement:
    if isinstance(raw, str):
        return Requirement(((raw,),))
    return Requirement(tuple((alt,) if isinstance(alt, str) else tuple(alt) for alt in raw["any_of"]))


def _engine(name: str, raw: Mapping[str, Any]) -> EngineRule:
    dropped = set(raw.get("drop_defects", ()))
    defects = tuple(
        Defect(code=d["code"], when=dict(d["when"]), verdict=d["verdict"],
               severity=d.get("severity", DEFAULT_SEVERITY[d["verdict"]]), message=d["message"],
               remedy=d.get("remedy"), reference=d.get("reference"), versions=d.get("versions"),
               per_module_facts=tuple(d.get("per_module_facts", ())))
        for d in raw.get("defects", ())
        if d["code"] not in dropped
    )
    return EngineRule(
        engine=name,
        version=str(raw.get("version", "0")),
        draft_architecture=raw.get("draft_architecture"),
        method=raw.get("method"),
        layer_use=raw.get("layer_use", "reuse_first"),
        source=raw.get("source"),
        runtime_names=tuple(RuntimeName(r["from"], r["to"]) for r in raw.get("runtime_names", ())),
        exclude_names=str(raw.get("exclude_names", "either")),
        forced_unquantized=tuple(
            ForcedUnquantized(tuple(f["modules"]), _when(f.get("when")), f.get("versions"), f.get("reference"))
            for f in raw.get("forced_unquantized", ())
        ),
        draft_quant=tuple(
            DraftQuantRule(q["result"], _when(q.get("when")), q.get("note"), q.get("reference"))
            for q in raw.get("draft_quant", ())
        ),
        defects=defects,
    )


def _check_claims(families: tuple[FamilyRule, ...]) -> None:
    """Two families of one directory must not claim the same architecture or model_type."""
    claims: dict[tuple[int, str, str, tuple[str, ...]], FamilyRule] = {}
    for fam in families:
        for kind, values in (("architecture", fam.architectures), ("model_type", fam.model_types)):
            for value in values:
                key = (fam.origin, kind, value, fam.config_keys)
                other = claims.get(key)
                if other is not None:
                    raise RuleError(f"$.match: {kind} {value!r} is also claimed by family {other.id!r} "
                                    f"({other.source})", path=fam.source)
                claims[key] = fam
