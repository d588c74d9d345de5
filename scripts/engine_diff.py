"""Diff a new engine wheel against the last one, limited to what the rules cite.

    python scripts/engine_diff.py OLD NEW [--engine vllm|sglang] [--format text|json]

OLD / NEW: a wheel (``pip download --no-deps vllm==0.34.0``) or an unpacked source tree (the directory
holding ``vllm/`` or ``sglang/``). Every engine source citation in rules/**/*.yaml and ckptinspect/**/*.py
(``VL:path.py Name.attr`` for vLLM, ``SG:path.py ...`` for SGLang; rule file headers define the
shorthands) is looked up in both trees: a cited file that is gone, a cited function or class that is gone
or whose code changed (compared as Python ASTs, so formatting does not count), with the rule files that
cite it. New draft model files (names with mtp / nextn / dspark / eagle) are listed too: candidates for new
family rules. The output is the work list of the next release; nothing is decided by it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = {"vllm": "VL:", "sglang": "SG:"}
# SGLang's shorthand SG: names python/sglang/srt/ (rules/engines/sglang.yaml header); vLLM's VL: names vllm/.
BASE = {"vllm": "vllm/", "sglang": "sglang/srt/"}
SHORTHAND_BASES = {"vllm": ("vllm/model_executor/layers/quantization/", "vllm/model_executor/models/"),
                   "sglang": ("sglang/srt/layers/quantization/", "sglang/srt/models/")}
CITATION = re.compile(r"(VL|SG):([A-Za-z0-9_./-]+\.py)((?:[ ,/]+(?:and )?[A-Za-z_][A-Za-z0-9_.]*(?:\(\))?)*)")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
DRAFT_NAMES = re.compile(r"(mtp|nextn|dspark|eagle)", re.IGNORECASE)


@dataclass
class Cited:
    path: str  # below the engine package, e.g. model_executor/models/deepseek_mtp.py
    names: set[str] = field(default_factory=set)  # functions / classes / Class.method cited with it
    by: set[str] = field(default_factory=set)  # repository files that cite it


@dataclass
class Change:
    path: str
    status: str  # file removed | file unchanged | changed | name removed | name changed
    name: str | None
    cited_by: list[str]


def citations(engine: str) -> dict[str, Cited]:
    """Every (file, names) the rules and the code cite for ``engine``."""
    prefix = PREFIX[engine][:2]
    out: dict[str, Cited] = {}
    files = [*ROOT.glob("rules/**/*.yaml"), *ROOT.glob("ckptinspect/**/*.py")]
    for path in files:
        text = path.read_text(encoding="utf-8")
        for match in CITATION.finditer(text):
            if match.group(1) != prefix:
                continue
            cited = out.setdefault(match.group(2), Cited(match.group(2)))
            cited.by.add(str(path.relative_to(ROOT)))
            for name in IDENT.findall(match.group(3) or ""):
                if name not in ("and", "at", "v0") and not name[0].isdigit():
                    cited.names.add(name)
    return out


class Tree:
    """An engine's source: a wheel read in place, or a directory."""

    def __init__(self, where: Path, engine: str) -> None:
        self.engine = engine
        self.zip = zipfile.ZipFile(where) if where.is_file() else None
        self.root = where
        package = engine + "/"
        if self.zip is not None:
            self.names = {n for n in self.zip.namelist() if n.endswith(".py") and n.startswith(package)}
        else:
            self.names = {str(p.relative_to(where)) for p in where.glob(f"{engine}/**/*.py")}

    def resolve(self, rel: str) -> str | None:
        """The file a citation names: below the package, else below a folder a rule file's shorthand
        names (rules/quant/vllm.yaml: VL: = .../layers/quantization/, VLM: = .../models/)."""
        for base in (BASE[self.engine], *SHORTHAND_BASES[self.engine]):
            if base + rel in self.names:
                return base + rel
        return None

    def read(self, rel: str) -> str | None:
        name = self.resolve(rel)
        if name is None:
            return None
        if self.zip is not None:
            return self.zip.read(name).decode("utf-8", errors="replace")
        return (self.root / name).read_text(encoding="utf-8", errors="replace")


def definitions(source: str) -> dict[str, str]:
    """name -> AST dump of every top-level function / class and every method (as Class.method)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = ast.dump(node, include_attributes=False)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out[f"{node.name}.{item.name}"] = ast.dump(item, include_attributes=False)
                        out.setdefault(item.name, out[f"{node.name}.{item.name}"])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    out[target.id] = ast.dump(node, include_attributes=False)
    return out


def compare(old: Tree, new: Tree, cited: dict[str, Cited]) -> list[Change]:
    changes: list[Change] = []
    for rel in sorted(cited):
        entry = cited[rel]
        by = sorted(entry.by)
        before, after = old.read(rel), new.read(rel)
        if before is None and after is None:
            continue  # cited for another release layout than both of these
        if after is None:
            changes.append(Change(rel, "file removed", None, by))
            continue
        if before is None:
            changes.append(Change(rel, "file new (cited)", None, by))
            continue
        if before == after:
            continue
        defs_old, defs_new = definitions(before), definitions(after)
        names = sorted(entry.names & (set(defs_old) | set(defs_new)))
        # a bare method name is reported under its Class.method spelling when that is cited too
        names = [n for n in names if "." in n or not any(m.endswith("." + n) for m in names)]
        if not names:
            changes.append(Change(rel, "changed", None, by))
            continue
        for name in names:
            if name not in defs_new:
                changes.append(Change(rel, "name removed", name, by))
            elif defs_old.get(name) != defs_new[name]:
                changes.append(Change(rel, "name changed", name, by))
    return changes


def new_drafts(old: Tree, new: Tree) -> list[str]:
    return sorted(n for n in new.names - old.names if DRAFT_NAMES.search(n.rsplit("/", 1)[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/engine_diff.py", description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--engine", choices=sorted(PREFIX), default="vllm")
    ap.add_argument("--format", choices=["text", "json"], default="text")
    a = ap.parse_args(argv)
    for where in (a.old, a.new):
        if not where.exists():
            print(f"error: {where}: no such wheel or directory", file=sys.stderr)
            return 2
    old, new = Tree(a.old, a.engine), Tree(a.new, a.engine)
    cited = citations(a.engine)
    changes = compare(old, new, cited)
    drafts = new_drafts(old, new)
    if a.format == "json":
        print(json.dumps({"cited_files": len(cited), "changes": [asdict(c) for c in changes], "new_draft_files": drafts},
                         indent=2))
        return 0
    print(f"{len(cited)} {a.engine} files cited by the rules and the code; {len(changes)} cited items changed")
    for change in changes:
        what = f"{change.path} {change.name}" if change.name else change.path
        print(f"{change.status:<16} {what}\n                 cited by {', '.join(change.cited_by)}")
    if drafts:
        print(f"\nnew draft model files ({len(drafts)}):")
        print("\n".join(f"  {name}" for name in drafts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
