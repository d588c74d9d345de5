"""`ckptinspect diff A B` — what changed between two checkpoints (e.g. BF16 original vs its quant)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ckptinspect.cli.options import Command, checkpoint_options, not_applicable, wide_option

EXAMPLES = (
    "ckptinspect diff Qwen/Qwen3.5-397B-A17B nvidia/Qwen3.5-397B-A17B-NVFP4",
    "ckptinspect diff ./bf16 ./my-nvfp4 --fail-on error --format json   # CI: exit 1 if the MTP layer was dropped",
)


@click.command("diff", cls=Command, examples=EXAMPLES, refused=("--revision",), formats=("text", "json"))
@click.argument("a")
@click.argument("b")
@click.option("--fail-on", type=click.Choice(["warning", "error"]), default=None,
              help="Exit 1 when a diff finding has this severity or worse (e.g. error: mtp-dropped).")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Extra MTP family rule directory (repeatable).")
@click.option("--limit", type=int, default=20, show_default=True, help="Rows per text section.")
@checkpoint_options()
@wide_option
def diff(a: str, b: str, fail_on: str | None, rules_dirs: tuple[Path, ...], limit: int, fmt: str,
         revision: str | None, token: str | None, quiet: bool, verbose: bool, wide: bool) -> None:
    """Compare checkpoint A (reference) with B: scheme changes per module pattern, modules that
    disappeared (above all the MTP layer) or appeared, exclude-list differences, size change."""
    import time

    from ckptinspect import api
    from ckptinspect.cli.options import colour_enabled, current_settings, output_width, progress_enabled
    from ckptinspect.render.diff_out import render_diff

    if revision is not None:
        raise not_applicable("diff", "--revision", "it reads two references; pin each as org/name@REV")
    if fmt == "markdown":
        raise not_applicable("diff", "--format markdown", "the diff is text or json")
    started = time.perf_counter()
    stats: dict = {}
    result = api.diff(a, b, rules_dirs=rules_dirs, token=token, progress=progress_enabled(quiet), stats=stats,
                      settings=current_settings())
    if verbose:
        from ckptinspect.render.stats_out import stats_line

        for label in ("A", "B"):
            click.echo(stats_line(stats[label], time.perf_counter() - started, label=label), err=True)
    click.echo(render_diff(result, fmt, limit=limit, width=output_width(fmt, wide), colour=colour_enabled()))
    if fail_on is not None:
        tripped = api.diff_gate(result, fail_on)
        if tripped:
            click.echo(f"fail-on {fail_on}: {', '.join(tripped)}", err=True)
            sys.exit(1)
