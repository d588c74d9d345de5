"""Docs as a product: generated examples are current, named files exist, nothing cites session-only paths."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gen_docs  # noqa: E402

# Top-level folders of the repository, and subpackages of ckptinspect that docs name without the
# `ckptinspect/` prefix (`render/text.py`); a path starting with one of these must exist.
TOP_LEVEL = ("ckptinspect", "tests", "fixtures", "docs", "rules", "scripts", "benchmarks", ".ci")
SUBPACKAGES = ("sources", "header", "config", "inventory", "quant", "readiness", "plan", "render", "probe",
               "cli", "examples")
PATH = re.compile(r"(?<![\w./:@~-])((?:%s)/[\w./*{},-]*[\w*}])" % "|".join(re.escape(p) for p in TOP_LEVEL
                                                                          + SUBPACKAGES))
# Made at build time, not in the checkout: the wheel's copy of rules/ (pyproject.toml force-include).
BUILT = ("ckptinspect/_rules",)
# Facts about other projects (engine sources, their docs, their tests), cited with their own paths.
NOT_OURS = ("docs/reference/",)
SCANNED_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".json")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in out.split("\0") if name]


def _expand(path: str) -> list[str]:
    """``a/{b,c}.yaml`` -> ``a/b.yaml``, ``a/c.yaml``; a placeholder ``a/{engine}.yaml`` -> ``a/*.yaml``."""
    parts = re.split(r"\{([^{}]*)\}", path)
    options = [[p] if i % 2 == 0 else (p.split(",") if "," in p else ["*"]) for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*options)]


def _exists(path: str) -> bool:
    if path.startswith(BUILT):
        return True
    first = path.split("/", 1)[0]
    bases = [ROOT] if first in TOP_LEVEL else [ROOT / "ckptinspect"]
    for candidate in _expand(path):
        for base in bases:
            if "*" in candidate:
                if any(base.glob(candidate)):
                    break
            elif (base / candidate).exists():
                break
        else:
            return False
    return True


def named_paths(text: str) -> set[str]:
    return {m.rstrip(".,") for m in PATH.findall(text)}


def test_every_named_repository_path_exists():
    missing = []
    for file in tracked_files():
        rel = file.relative_to(ROOT).as_posix()
        if (file.suffix not in SCANNED_SUFFIXES and rel != ".ci/run") or rel.startswith(NOT_OURS):
            continue
        if file.suffix == ".json" and "schema" not in file.name:
            continue  # data files (configs copied from releases) name paths of other repositories
        text = file.read_text(encoding="utf-8", errors="replace")
        missing += [f"{rel}: {p}" for p in sorted(named_paths(text)) if not _exists(p)]
    assert not missing, "files named that do not exist:\n" + "\n".join(missing)


def test_path_scanner_finds_what_it_must():
    # the missing names are assembled here so that this file does not name them itself
    gone_render, gone_test = "render/" + "markdown.py", "tests/" + "test_report_imports.py"
    gone_rule = "rules/engines/" + "{common,nothing}.yaml"
    text = (f"see {gone_render} and `{gone_test}`; " + "rules/engines/{common,sglang}.yaml; "
            "SG:models/deepseek_nextn.py, vllm/config/cache.py, https://x.org/docs/a.md")
    found = named_paths(text)
    assert found == {gone_render, gone_test, "rules/engines/{common,sglang}.yaml"}
    assert not _exists(gone_render) and not _exists(gone_test)
    assert _exists("rules/engines/{common,sglang}.yaml") and _exists("rules/families/*.yaml")
    assert _exists("render/text.py") and not _exists(gone_rule)


def test_product_code_never_cites_the_session_shared_folder():
    banned = ("/work/" + "shared", "../" + "shared")  # split so this file does not cite them either
    offenders = []
    for file in tracked_files():
        rel = file.relative_to(ROOT).as_posix()
        if rel.startswith("docs/reference/") or file.suffix in (".safetensors",) or not file.is_file():
            continue
        text = file.read_text(encoding="utf-8", errors="replace")
        offenders += [f"{rel}: {b}" for b in banned if b in text]
    assert not offenders, offenders


def test_no_stray_files_at_the_root():
    root_files = [p for p in tracked_files() if p.parent == ROOT]
    assert all(p.stat().st_size > 0 for p in root_files), [p.name for p in root_files if p.stat().st_size == 0]
    assert not (ROOT / "1").exists()
    assert not (ROOT / "docs" / "ARCHITECTURE.md").exists()  # one architecture document: docs/architecture.md


def test_every_marker_names_a_generator_and_every_generator_is_used():
    used = set()
    for rel in gen_docs.DOC_FILES:
        text = (ROOT / rel).read_text(encoding="utf-8")
        opened = re.findall(r"<!-- gen:([\w-]+) -->", text)
        closed = re.findall(r"<!-- /gen:([\w-]+) -->", text)
        assert opened == closed, rel
        assert set(opened) <= set(gen_docs.BLOCKS), rel
        used |= set(opened)
    assert used == set(gen_docs.BLOCKS)
    others = [p for p in tracked_files() if p.suffix == ".md" and p.relative_to(ROOT).as_posix()
              not in gen_docs.DOC_FILES]
    assert not [p for p in others if "<!-- gen:" in p.read_text(encoding="utf-8")]


def test_generated_examples_are_current(qwen35_replica):
    ctx = gen_docs.Context(replica=qwen35_replica)
    try:
        stale = gen_docs.stale_blocks(ctx)
    finally:
        ctx.close()
    if stale:
        import difflib

        rel, fresh = sorted(stale.items())[0]
        diff = difflib.unified_diff((ROOT / rel).read_text(encoding="utf-8").splitlines(), fresh.splitlines(),
                                    rel, f"{rel} (regenerated)", lineterm="", n=1)
        detail = "\n".join(list(diff)[:40])
        raise AssertionError(f"stale generated blocks in {sorted(stale)}: run python scripts/gen_docs.py\n{detail}")


def test_the_bundled_example_block_shows_the_mtp_fc_warning():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- gen:bundled-report -->", 1)[1].split("<!-- /gen:bundled-report -->", 1)[0]
    findings = block.split("Findings\n========", 1)[1]
    assert re.search(r"^warning +unquantized-not-excluded +mtp\.fc: ", findings, re.M)
    assert "..." not in block  # the whole report, never cut
    assert "READY" in block


def test_regenerate_replaces_only_the_marked_block():
    ctx = gen_docs.Context()
    try:
        text = "keep\n<!-- gen:rules-list -->\nold\n<!-- /gen:rules-list -->\nkeep too\n"
        fresh = gen_docs.regenerate(text, ctx, {})
    finally:
        ctx.close()
    head, rest = fresh.split("<!-- gen:rules-list -->\n", 1)
    body, tail = rest.split("<!-- /gen:rules-list -->", 1)
    assert head == "keep\n" and tail == "\nkeep too\n"
    assert body.startswith("```text\n$ ckptinspect rules list --wide\n") and "deepseek_v3" in body and "old" not in body
