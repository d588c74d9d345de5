"""`ckptinspect rules list | show FAMILY | validate PATH...` — the MTP family rule files."""

from __future__ import annotations

import sys
from pathlib import Path

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


@rules.command("list", epilog="\b\nExamples:\n  ckptinspect rules list\n  ckptinspect rules list --all --format json")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--all", "show_all", is_flag=True, help="Include abstract base rules.")
@click.pass_context
def list_cmd(ctx: click.Context, fmt: str, show_all: bool) -> None:
    """One line per family: what it matches, where its MTP layer lives, each engine's draft model."""
    from ckptinspect import api
    from ckptinspect.render.rules_out import render_rules_list

    families = api.list_rules(ctx.obj.get("rules_dirs", ()), include_abstract=show_all)
    click.echo(render_rules_list(families, fmt))


@rules.command("show", epilog="\b\nExamples:\n  ckptinspect rules show qwen3_5_moe\n"
                                "  ckptinspect rules show deepseek_v3 --format json")
@click.argument("family")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.pass_context
def show_cmd(ctx: click.Context, family: str, fmt: str) -> None:
    """Print FAMILY's rule with everything it inherits (``extends``) resolved."""
    from ckptinspect import api
    from ckptinspect.render.rules_out import render_family_rule

    click.echo(render_family_rule(api.family_rule(family, ctx.obj.get("rules_dirs", ())), fmt))


@rules.command("validate", epilog="\b\nExamples:\n  ckptinspect rules validate rules/families/\n"
                                    "  ckptinspect rules validate ./my-rules/toy_mtp.yaml")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.pass_context
def validate_cmd(ctx: click.Context, paths: tuple[Path, ...]) -> None:
    """Check rule files (or directories of them) against their schema and the built-in rules.

    Family files are resolved with the built-ins; engine (rules/engines/*.yaml) and GPU catalog
    (rules/gpus.yaml) files are checked against their own schema. Prints one line per file; exits 2 when any file is invalid, naming the file, the path inside the
    document and the schema message.
    """
    from ckptinspect import api
    from ckptinspect.render.rules_out import rule_check_line

    checks = api.validate_rules(paths, ctx.obj.get("rules_dirs", ()))
    for check in checks:
        click.echo(rule_check_line(check), err=check.error is not None)
    if any(check.error is not None for check in checks):
        sys.exit(2)
