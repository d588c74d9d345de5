"""`ckptinspect diff A B` — what changed between two checkpoints (e.g. BF16 original vs its quant)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ckptinspect.cli.options import Command, wide_option

EXAMPLES = (
    "ckptinspect diff Qwen/Qwen3.5-397B-A17B nvidia/Qwen3.5-397B-A17B-NVFP4",
    "ckptinspect diff ./bf16 ./my-nvfp4 --fail-on error --format json   # CI: exit 1 if the MTP layer was dropped",
)


@click.command("diff", cls=Command, examples=EXAMPLES)
@click.argument("a")
@click.argument("b")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on", type=click.Choice(["warning", "error"]), default=None,
              help="Exit 1 when a diff finding has this severity or worse (e.g. error: mtp-dropped).")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Extra MTP family rule directory (repeatable).")
@click.option("--limit", type=int, default=20, show_default=True, help="Rows per text section.")
@wide_option
def diff(a: str, b: str, fmt: str, fail_on: str | None, rules_dirs: tuple[Path, ...], limit: int,
         wide: bool) -> None:
    """Compare checkpoint A (reference) with B: scheme changes per module pattern, modules that
    disappeared (above all the MTP layer) or appeared, exclude-list differences, size change."""
    from ckptinspect import api
    from ckptinspect.cli.options import colour_enabled, output_width
    from ckptinspect.render.diff_out import render_diff

    result = api.diff(a, b, rules_dirs=rules_dirs)
    click.echo(render_diff(result, fmt, limit=limit, width=output_width(fmt, wide), colour=colour_enabled()))
    if fail_on is not None:
        tripped = api.diff_gate(result, fail_on)
        if tripped:
            click.echo(f"fail-on {fail_on}: {', '.join(tripped)}", err=True)
            sys.exit(1)
