"""`ckptinspect diff A B` — what changed between two checkpoints (e.g. BF16 original vs its quant)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Extra MTP family rule directory (repeatable).")
@click.option("--limit", type=int, default=20, show_default=True, help="Rows per text section.")
def diff(a: str, b: str, fmt: str, rules_dirs: tuple[Path, ...], limit: int) -> None:
    """Compare checkpoint A (reference) with B: scheme changes per module pattern, modules that
    disappeared (above all the MTP layer) or appeared, exclude-list differences, size change."""
    from ckptinspect.diff import load_and_diff, render_text

    result = load_and_diff(a, b, rules_dirs=rules_dirs)
    if fmt == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(render_text(result, limit=limit))
