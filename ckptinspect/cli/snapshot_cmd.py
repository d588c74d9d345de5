"""``ckptinspect snapshot MODEL -o FILE.json.gz``: save all metadata of a checkpoint into one file."""

from __future__ import annotations

import os

import click

from ckptinspect.cli.options import Command, checkpoint_options, not_applicable

EXAMPLES = (
    "ckptinspect snapshot nvidia/Qwen3.5-397B-A17B-NVFP4 -o qwen35-nvfp4.json.gz   # online, headers only",
    "ckptinspect report qwen35-nvfp4.json.gz --gpu b200 --gpus 8                   # later, air-gapped",
)


@click.command("snapshot", cls=Command, examples=EXAMPLES, refused=("--format",))
@click.argument("model")
# a str, not a Path: pathlib drops a trailing slash, and `-o x.json.gz/` names a directory (an error)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Snapshot file to write (.json.gz).")
@checkpoint_options()
def snapshot(model: str, output: str, fmt: str, revision: str | None, token: str | None, quiet: bool,
             verbose: bool) -> None:
    """Write MODEL's config files, index and every shard header into one gzip JSON file.

    MODEL is a directory, an org/name[@revision] Hub repo (only headers are fetched) or another
    snapshot. `ckptinspect report FILE.json.gz` then works offline with the same result.
    """
    from ckptinspect import api
    from ckptinspect.cli.options import current_settings, progress_enabled
    from ckptinspect.render.snapshot_out import snapshot_stats, snapshot_summary

    if fmt != "text":
        raise not_applicable("snapshot", f"--format {fmt}", "it writes a .json.gz file (its summary line is text)")
    if not str(output).endswith(".json.gz"):
        raise click.BadParameter("the snapshot file name must end with .json.gz", param_hint="--output")
    raw = api.snapshot(model, output, revision=revision, token=token, progress=progress_enabled(quiet),
                       settings=current_settings())
    if verbose:
        click.echo(snapshot_stats(raw), err=True)
    if not quiet:
        click.echo(snapshot_summary(raw, output, os.stat(output).st_size))
