"""`ckptinspect rules list | show FAMILY | validate PATH...` — the MTP family rule files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click


@click.group("rules", epilog="""\b
Examples:
  ckptinspect rules list
  ckptinspect rules show deepseek_v3
  ckptinspect rules validate ./my-rules/  # CI for your own rule files""")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Extra rule directory (repeatable); its families override built-ins with the same id.")
@click.pass_context
def rules(ctx: click.Context, rules_dirs: tuple[Path, ...]) -> None:
    """List, show and validate MTP family rule files (rules/families/*.yaml)."""
    ctx.ensure_object(dict)
    ctx.obj["rules_dirs"] = rules_dirs


def _ruleset(ctx: click.Context) -> Any:
    from ckptinspect.readiness import load_rules

    return load_rules(ctx.obj.get("rules_dirs", ()))


def _origin(fam: Any) -> str:
    return "built-in" if fam.origin == 0 else fam.source


@rules.command("list", epilog="\b\nExamples:\n  ckptinspect rules list\n  ckptinspect rules list --all --format json")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--all", "show_all", is_flag=True, help="Include abstract base rules.")
@click.option("--wide", is_flag=True, help="Full-width text; by default text wraps to COLUMNS or the terminal width.")
@click.pass_context
def list_cmd(ctx: click.Context, fmt: str, show_all: bool, wide: bool) -> None:
    """One line per family: what it matches, where its MTP layer lives, each engine's draft model."""
    ruleset = _ruleset(ctx)
    families = ruleset.families if show_all else ruleset.concrete()
    rows = []
    for fam in families:
        mtp = fam.mtp
        rows.append({
            "id": fam.id, "name": fam.name, "abstract": fam.abstract,
            "architectures": list(fam.architectures), "model_types": list(fam.model_types),
            "mtp": mtp.supported, "prefixes": list(fam.mtp_prefixes), "depth_keys": list(mtp.depth_keys),
            "sglang": fam.engines["sglang"].draft_architecture if "sglang" in fam.engines else None,
            "vllm": fam.engines["vllm"].draft_architecture if "vllm" in fam.engines else None,
            "source": _origin(fam),
        })
    if fmt == "json":
        click.echo(json.dumps({"families": rows}, indent=2))
        return
    from ckptinspect.cli.options import output_width
    from ckptinspect.render.terminal import table as fit_table

    def archs(names: list[str]) -> str:
        return "-" if not names else names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")

    # Every model_type is listed (not abbreviated like architectures): it is what users grep
    # config.json for, and a family matched only by text_config.model_type must be findable here.
    table = [[r["id"], archs(r["architectures"]), ", ".join(r["model_types"]) or "-",
              r["prefixes"][0] if r["prefixes"] else "-", r["depth_keys"][0] if r["depth_keys"] else "-",
              r["sglang"] or "-", r["vllm"] or "-", r["source"]] for r in rows]
    click.echo(fit_table(["family", "architectures", "model types", "MTP prefix", "depth key", "SGLang draft",
                          "vLLM draft", "source"], table, output_width(fmt, wide)))


@rules.command("show", epilog="\b\nExamples:\n  ckptinspect rules show qwen3_5_moe\n"
                                "  ckptinspect rules show deepseek_v3 --format json")
@click.argument("family")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.pass_context
def show_cmd(ctx: click.Context, family: str, fmt: str) -> None:
    """Print FAMILY's rule with everything it inherits (``extends``) resolved."""
    from ckptinspect.errors import RuleError

    ruleset = _ruleset(ctx)
    fam = ruleset.get(family)
    if fam is None:
        known = ", ".join(f.id for f in ruleset.concrete())
        raise RuleError(f"unknown family {family!r} (known: {known})")
    doc = {k: v for k, v in fam.document.items() if k != "extends"}
    doc["id"], doc["name"] = fam.id, fam.name
    if fmt == "json":
        click.echo(json.dumps({"source": fam.source, "extends": fam.extends, "rule": doc}, indent=2))
        return
    import yaml

    head = f"# {fam.id}: {fam.source}"
    if fam.extends:
        head += f"\n# extends {fam.extends} (inherited entries merged below)"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    click.echo(head + "\n" + yaml.dump(doc, Dumper=dumper, sort_keys=False, width=110, allow_unicode=True))


@rules.command("validate", epilog="\b\nExamples:\n  ckptinspect rules validate rules/families/\n"
                                    "  ckptinspect rules validate ./my-rules/toy_mtp.yaml")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.pass_context
def validate_cmd(ctx: click.Context, paths: tuple[Path, ...]) -> None:
    """Check rule files (or directories of them) against the schema and the built-in rules.

    Prints one line per file; exits 2 when any file is invalid, naming the file, the path inside the
    document and the schema message.
    """
    from ckptinspect.errors import RuleError
    from ckptinspect.readiness.loader import load_rules, read_rule_file, rule_files

    failures = 0
    extra_dirs = ctx.obj.get("rules_dirs", ())

    def check(action) -> bool:  # type: ignore[no-untyped-def]
        nonlocal failures
        try:
            action()
        except RuleError as exc:
            failures += 1
            click.echo(f"invalid: {exc}", err=True)
            return False
        return True

    for path in paths:
        if path.is_dir():
            # Schema per file, then the directory resolved as a whole (files may extend each other).
            files = rule_files(path)
            good = [f for f in files if check(lambda f=f: read_rule_file(f))]
            if len(good) == len(files) and check(lambda: load_rules((*extra_dirs, path))):
                for file in files:
                    click.echo(f"ok: {file}")
            continue
        # A single file is resolved together with the built-ins (and any --rules-dir): catches an
        # unknown `extends`, claims that collide inside one layer, a family without engines.
        if check(lambda: read_rule_file(path)) and check(lambda: load_rules(extra_dirs, extra_files=[path])):
            click.echo(f"ok: {path}")
    if failures:
        sys.exit(2)
