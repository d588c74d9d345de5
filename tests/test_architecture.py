"""Structure the project promises (docs/architecture.md): no import cycles between modules, counting
imports inside functions too; no module over 400 lines; the report path never imports torch; output
layout is built only in render/ (records stay plain data); cli/ imports only api, render, cli and
errors; one `when:` evaluator (ckptinspect/rules/conditions.py), which imports neither readiness nor
plan. Every checker is first shown to flag a small bad example. (That every file path named in docs,
comments and code exists is tests/test_docs.py's job.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ckptinspect"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                # the deepest project module the import names (a package's __init__ counts as itself)
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_detects_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None


def test_modules_stay_under_the_size_budget():
    big = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert big == {}


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
    "ckptinspect/probe/server_client.py": "request bodies sent to a running SGLang server",
    "ckptinspect/probe/sequences.py": "the --save-continuations file the probe reads back",
    "ckptinspect/probe/loader.py": "config / index files of the probe's temporary model directory",
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


# -- the CLI is thin: options, api, render -------------------------------------------------------------
CLI_MAY_IMPORT = ("api", "render", "cli", "errors")


def cli_import_violations(rel: str, source: str) -> list[str]:
    """Project modules a cli/ module imports other than ckptinspect.{api, render, cli, errors}."""
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


def test_cli_imports_only_api_render_cli_and_errors():
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


def test_rules_package_imports_neither_readiness_nor_plan():
    """Readiness and plan register their conditions in ckptinspect.rules; the arrow never points back."""
    graph = import_graph()
    back = {(m, t) for m, targets in graph.items() if m.startswith("ckptinspect.rules")
            for t in targets if t.startswith(("ckptinspect.readiness", "ckptinspect.plan"))}
    assert back == set()
