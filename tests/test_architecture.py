"""Structure the project promises (docs/architecture.md): import-linter contracts (.importlinter: no
import cycles between sibling modules or packages, counting imports inside functions too; cli/ thin over
api; rules below readiness and plan; readiness below plan; sources below the later stages); every module
says in its docstring what it is (size is judged by concept in review, not by a line count: a cap split
modules at arbitrary lines and kept none small by concept); the report path never imports torch; output
layout is built only in render/ (records stay plain data); cli/ imports only api, render, cli,
settings and errors; one `when:` evaluator (ckptinspect/rules/conditions.py), which imports neither readiness nor
plan. Every checker is first shown to flag a small bad example. (That every file path named in docs,
comments and code exists is tests/test_docs.py's job.)"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ckptinspect"


def _lint_imports(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
                           "sys.argv = ['lint-imports', '--config', sys.argv[1], '--no-cache']; c()", str(config)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_import_contracts_flag_what_they_must(tmp_path):
    """A contract the code breaks (the pipeline imports the sources) is reported as broken."""
    bad = tmp_path / "contracts.ini"
    bad.write_text("[importlinter]\nroot_package = ckptinspect\n\n[importlinter:contract:x]\nname = x\n"
                   "type = forbidden\nsource_modules =\n    ckptinspect.pipeline\nforbidden_modules =\n"
                   "    ckptinspect.sources\n")
    done = _lint_imports(bad)
    assert done.returncode != 0 and "BROKEN" in done.stdout, done.stdout + done.stderr


def test_import_contracts_hold():
    """.importlinter: no import cycles between sibling modules / packages, cli/ thin over api, the rules
    engine below readiness and plan, sources below every later stage (import-linter checks them)."""
    done = _lint_imports(ROOT / ".importlinter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 kept, 0 broken" in done.stdout


# What may import ckptinspect.sources: the sources themselves and what opens a reference (the pipeline,
# the library API and its helpers, the audit's shared network limits, the probe's local reader, the CLI).
ABOVE_THE_SOURCES = {"sources", "pipeline", "api", "refs", "audit", "probe", "cli", "verify",
                     "__init__", "__main__"}


def test_every_stage_below_the_pipeline_is_in_the_no_sources_contract():
    """The `nothing-below-the-pipeline-imports-sources` contract names every other module and package,
    so a new stage is checked from its first commit (or consciously listed above)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    listed = set(config["importlinter:contract:nothing-below-the-pipeline-imports-sources"]["source_modules"].split())
    present = {f"ckptinspect.{p.stem if p.is_file() else p.name}" for p in PACKAGE.iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert present - listed == {f"ckptinspect.{name}" for name in ABOVE_THE_SOURCES}
    assert listed <= present  # no stale names


def test_the_no_sources_contract_catches_an_import(tmp_path):
    """The contract is live: the same contract over a copy of the package in which inventory imports
    sources is broken (import-linter reads the copy through PYTHONPATH)."""
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(PACKAGE, copy / "ckptinspect", ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    scan = copy / "ckptinspect" / "inventory" / "build.py"
    scan.write_text(scan.read_text(encoding="utf-8") + "\nfrom ckptinspect.sources import interface  # noqa\n",
                    encoding="utf-8")
    config = tmp_path / ".importlinter"
    config.write_text((ROOT / ".importlinter").read_text(encoding="utf-8"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
                           "sys.argv = ['lint-imports', '--config', sys.argv[1], '--no-cache']; c()", str(config)],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(copy)})
    assert done.returncode != 0
    assert "ckptinspect.inventory.build -> ckptinspect.sources.interface" in done.stdout


def _without_docstring(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if (text := p.read_text(encoding="utf-8")).strip() and ast.get_docstring(ast.parse(text)) is None)


def test_every_module_says_what_it_is(tmp_path):
    """One concept per module, named in its docstring (the first thing a reader and `help()` see)."""
    bad = tmp_path / "pkg"
    bad.mkdir()
    (bad / "named.py").write_text('"""What this is."""\nX = 1\n')
    (bad / "unnamed.py").write_text("X = 1\n")
    assert _without_docstring(bad) == ["unnamed.py"]
    assert _without_docstring(PACKAGE) == []


def test_report_path_never_imports_torch():
    code = ("import sys, ckptinspect.pipeline as p; p.build_report(sys.argv[1], progress=False); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'));"
            "print(bad); sys.exit(1 if bad else 0)")
    example = PACKAGE / "examples" / "qwen3_5_moe_nvfp4_tiny"
    done = subprocess.run([sys.executable, "-c", code, str(example)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_json_report_loads_no_terminal_code():
    """`report --format json` (the CI-gate and scripting path) renders without the table and terminal
    libraries: importing them costs tens of milliseconds on every call."""
    code = ("import sys; from ckptinspect import api; from ckptinspect.render.report import render_report; "
            "render_report(api.inspect(sys.argv[1], progress=False), 'json'); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tabulate', 'click', 'torch'));"
            "print(bad); sys.exit(1 if bad else 0)")
    example = PACKAGE / "examples" / "qwen3_5_moe_nvfp4_tiny"
    done = subprocess.run([sys.executable, "-c", code, str(example)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


# -- output layout lives in render/ ------------------------------------------------------------------
# Modules outside render/ that write JSON for a reason other than a command's output, and why.
JSON_WRITERS = {
    "ckptinspect/sources/snapshot.py": "the snapshot file (metadata a later `report` reads back)",
    "ckptinspect/plan/vllm.py": "the value of vLLM's --speculative-config flag is a JSON string",
    "ckptinspect/sources/hub_session.py": "request bodies the bounded client posts to an engine or main-model server",
    "ckptinspect/probe/sequences.py": "the --save-continuations file the probe reads back",
    "ckptinspect/probe/loader.py": "config / index files of the probe's temporary model directory",
    "ckptinspect/verify/request.py": "the dry-load request on the engine's stdin, when a config file holds Infinity / NaN "
                                     "(msgspec would write null)",
    "ckptinspect/verify/engine_side/_dryload_common.py": "the engine script's answer line (run by the engine's Python)",
    "ckptinspect/verify/engine_side/vllm_dryload.py": "the config files of the engine's scratch model directory",
    "ckptinspect/verify/engine_side/sglang_dryload.py": "the config files of the engine's scratch model directory",
    "ckptinspect/audit/cache.py": "the audit cache file (report documents by commit, read back by a later audit)",
    "ckptinspect/probe/prompts/__init__.py": "the chat template and its inputs sent to the bounded render child",
}
# Module names for the checkers' own examples (assembled, so that the docs test's path scan, which
# reads this file too, does not take them for files that should exist).
PLAN_X, CLI_X = "ckptinspect/plan" + "/x.py", "ckptinspect/cli" + "/x.py"
LAYOUT_METHODS = {"to_json", "as_json", "to_dict", "to_text", "to_markdown"}


def layout_violations(rel: str, source: str) -> list[str]:
    """What in one module outside render/ builds command output: a ``to_json``-style method or a
    ``render*`` function, or a ``json.dump(s)`` call."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if (node.name in LAYOUT_METHODS or node.name.startswith("render")):
                out.append((node.lineno, f"{rel}:{node.lineno} defines {node.name}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("dumps", "dump") and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "json" and rel not in JSON_WRITERS:
            out.append((node.lineno, f"{rel}:{node.lineno} calls json.{node.func.attr}"))
    return [text for _, text in sorted(out)]


def test_layout_checker_flags_what_it_must():
    bad = ("import json\nclass A:\n    def to_json(self):\n        return {}\n"
           "def render_table(x):\n    return json.dumps(x)\n")
    assert layout_violations(PLAN_X, bad) == [
        f"{PLAN_X}:3 defines to_json", f"{PLAN_X}:5 defines render_table",
        f"{PLAN_X}:6 calls json.dumps"]
    assert layout_violations(PLAN_X, "import json\njson.loads('1')\n") == []


def test_output_layout_is_built_only_in_render():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("ckptinspect/render/"):
            found += layout_violations(rel, path.read_text(encoding="utf-8"))
    assert found == []
    for rel in JSON_WRITERS:  # an exception nothing needs any more goes
        calls = layout_violations("ckptinspect/plan" + "/listed.py", (ROOT / rel).read_text(encoding="utf-8"))
        assert any("calls json." in c for c in calls), f"{rel} is listed as a JSON writer but writes no JSON"


# -- the CLI is thin: options, api, render (and the settings it builds at the edge) -------------------
CLI_MAY_IMPORT = ("api", "render", "cli", "errors", "settings")


def cli_import_violations(rel: str, source: str) -> list[str]:
    """Project modules a cli/ module imports other than ckptinspect.{api, render, cli, errors, settings}."""
    out = []
    for node in sorted((n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))),
                       key=lambda n: n.lineno):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if node.module == "ckptinspect":
                names = [f"ckptinspect.{a.name}" for a in node.names]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ckptinspect" and (len(parts) < 2 or parts[1] not in CLI_MAY_IMPORT):
                out.append(f"{rel}:{node.lineno} imports {name}")
    return out


def test_cli_import_checker_flags_what_it_must():
    src = ("from ckptinspect import api, plan\nimport ckptinspect.readiness.loader\n"
           "from ckptinspect.render.report import render_report\nfrom ckptinspect.errors import RuleError\n")
    assert cli_import_violations(CLI_X, src) == [
        f"{CLI_X}:1 imports ckptinspect.plan", f"{CLI_X}:2 imports ckptinspect.readiness.loader"]


def test_cli_imports_only_api_render_cli_settings_and_errors():
    found = []
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        found += cli_import_violations(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    assert found == []


# -- one `when:` evaluator ------------------------------------------------------------------------------
EVALUATOR = "ckptinspect/rules/conditions.py"


def when_evaluators(rel: str, source: str) -> list[str]:
    """Code that walks a `when` mapping itself (iterates ``when`` / ``when.items()`` / ``x.when``): only
    the one evaluator may; everyone else hands the mapping to it."""
    def is_when(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("items", "keys", "values"):
            node = node.func.value
        return (isinstance(node, ast.Name) and node.id == "when") or \
            (isinstance(node, ast.Attribute) and node.attr == "when") or \
            (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "when")

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            iters = [node.iter]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            iters = [g.iter for g in node.generators]
        else:
            continue
        out += [(node.lineno, f"{rel}:{node.lineno} iterates a when mapping") for it in iters if is_when(it)]
    return [text for _, text in sorted(out)]


def test_when_checker_flags_what_it_must():
    src = ("def matches(when, facts):\n    for key, want in when.items():\n        pass\n"
           "def other(rule):\n    return all(k for k in rule['when'])\n")
    assert when_evaluators(PLAN_X, src) == [f"{PLAN_X}:2 iterates a when mapping", f"{PLAN_X}:5 iterates a when mapping"]


def test_one_when_evaluator():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != EVALUATOR:
            found += when_evaluators(rel, path.read_text(encoding="utf-8"))
    assert found == []
    assert when_evaluators(EVALUATOR, (ROOT / EVALUATOR).read_text(encoding="utf-8")), "the evaluator moved?"
