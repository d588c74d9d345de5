"""`ckptinspect audit`: select repos, run ckptinspect.api.audit, render the rows, apply the gate."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ckptinspect.api import FAIL_ON_CHOICES
from ckptinspect.cli.options import (Command, checkpoint_options, gpu_list_help, not_applicable, resolve_gpu,
                                     verify_engine_options, wide_option)

EXAMPLES = (
    "ckptinspect audit --quantized-from Qwen/Qwen3.5-397B-A17B --gpu h200 --gpus 8",
    "ckptinspect audit org/quant-a org/quant-b --repos-file more.txt --format jsonl > audit.jsonl",
    "ckptinspect audit --author my-org --fail-on unusable --quiet     # CI: exit 1 on any bad quant",
)


@click.command(cls=Command, examples=EXAMPLES, refused=("--revision",), more_help=gpu_list_help)
@click.argument("repos", nargs=-1)
@click.option("--quantized-from", "quantized_from", metavar="BASE", default=None,
              help="The quants of base model BASE (the Hub's base_model:quantized:BASE relation).")
@click.option("--author", default=None, metavar="ORG", help="Repos owned by ORG (narrows the listing).")
@click.option("--search", default=None, metavar="TEXT", help="Repos whose id contains TEXT (narrows the listing).")
@click.option("--repos-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A file of repo ids, one per line (# comments allowed).")
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many repos from the listing.")
@click.option("--gpu", default=None, help="GPU name, alias or nvidia-smi name for the fit column (listed below; "
              "'8x NAME' sets --gpus).")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None, help="Number of GPUs for the fit column.")
@click.option("--context", type=click.IntRange(1), default=None, help="Context length for the fit.")
@click.option("--engine", type=click.Choice(["sglang", "vllm", "both"]), default="both", show_default=True,
              help="Engine(s) whose MTP verdict sorts the rows and --fail-on checks.")
@click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), default=None,
              help="Exit 1 when any repo's MTP verdict is this or worse, (error) any repo has an error "
                   "finding, or any repo could not be read.")
@click.option("--jobs", type=click.IntRange(1, 64), default=8, show_default=True, help="Repos read at once.")
@click.option("--max-requests", type=click.IntRange(2, 1024), default=64, show_default=True,
              help="Hub requests in flight at once, all repos together.")
@click.option("--no-cache", is_flag=True, help="Read every repo again (default: reuse reports of unchanged "
                                               "commits from CKPTINSPECT_CACHE_DIR/audit).")
@click.option("--full", is_flag=True, help="json / jsonl: add each repo's whole report document.")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Extra rule files (override built-in families by id). Repeatable.")
@verify_engine_options
@checkpoint_options("jsonl")
@wide_option
def audit(repos: tuple[str, ...], quantized_from: str | None, author: str | None, search: str | None,
          repos_file: Path | None, limit: int | None, gpu: str | None, gpus: int | None,
          context: int | None, engine: str, fail_on: str | None, jobs: int, max_requests: int, no_cache: bool,
          full: bool, rules_dirs: tuple[Path, ...], verify_engine: str | None, engine_python: str | None,
          engine_pythonpath: str | None, fmt: str, revision: str | None, token: str | None,
          quiet: bool, verbose: bool, wide: bool) -> None:
    """Audit many repos at once: one row per repo, the usable and fitting ones first.

    REPOS are repo ids; --quantized-from, --author and --search list repos on the Hub (together they
    narrow one listing). Each row is what `ckptinspect report REPO` says; a repo that cannot be read
    (gated, missing, timed out, malformed) is a row with its error. Reports are cached by commit, so a
    re-run reads only the repos that changed. Progress (repos done / total) shows on a terminal.
    --format jsonl writes one line per repo as it finishes (unsorted). With --verify-engine every
    readable repo's draft is also dry-loaded through that engine (one engine process for all repos, within
    --deadline) and its answer decides that engine's verdict; the rows then come when it has answered.
    """
    from ckptinspect import api
    from ckptinspect.cli.options import colour_enabled, current_settings, output_width, progress_enabled
    from ckptinspect.render.audit_out import jsonl_line, render_audit

    if not (repos or repos_file or quantized_from or author or search):
        raise click.UsageError("name repos, --repos-file, or a listing (--quantized-from, --author, --search)")
    if revision is not None:
        raise not_applicable("audit", "--revision", "it reads each repo's main branch (the Hub listing's)")
    # audit rows are cached and run by name: a catalog card (nvidia-smi names and '8x NAME' too), named
    # in the fit column as typed
    spec, gpus = resolve_gpu(gpu, gpus, None, None)
    gpu = api.split_gpu_count(gpu)[1] if spec is not None and gpu is not None else None
    if (gpu is None) != (gpus is None):
        raise click.UsageError("--gpu and --gpus go together (or --gpu '8x NAME')")
    started = time.perf_counter()
    refs = api.audit_select(ids=repos, ids_file=repos_file, quantized_from=quantized_from, author=author,
                            search=search, limit=limit, token=token, settings=current_settings())
    if not refs:
        click.echo("audit: no repos matched", err=True)
    show = progress_enabled(quiet)
    rows = []
    results = api.audit(refs, gpu=gpu, gpus=gpus, context=context, engine=engine, rules_dirs=rules_dirs,
                        token=token, jobs=jobs, max_requests=max_requests, cache=not no_cache,
                        verify_engine=verify_engine, engine_python=engine_python,
                        engine_pythonpath=engine_pythonpath, settings=current_settings())
    try:
        for row in results:
            rows.append(row)
            if fmt == "jsonl":  # one whole line per repo, flushed: an interrupted run leaves valid JSONL
                click.echo(jsonl_line(row, full=full), nl=False)
            if show:
                click.echo(f"\raudit: {len(rows)}/{len(refs)} repos", nl=False, err=True)
    except KeyboardInterrupt:
        results.close()
        if show:
            click.echo("", err=True)
        click.echo(f"audit: interrupted after {len(rows)}/{len(refs)} repos", err=True)
        sys.exit(130)
    finally:
        results.close()  # ends the audit's event loop whatever ended this one (a closed pipe, an error)
    if show:
        click.echo("", err=True)
    rows = api.audit_sort(rows, engine)
    if verbose:
        from ckptinspect.render.stats_out import stats_line

        click.echo(stats_line({"repos": len(rows)}, time.perf_counter() - started), err=True)
    if fmt != "jsonl":
        click.echo(render_audit(rows, fmt, width=output_width(fmt, wide), colour=colour_enabled(), full=full,
                                gpu=gpu, gpus=gpus), nl=False)
    if fail_on is not None:
        tripped = [(row.repo, why) for row in rows for why in api.audit_gate(row, fail_on, engine)]
        if tripped:
            repo, why = tripped[0]
            click.echo(f"fail-on {fail_on}: {len({r for r, _ in tripped})} repo(s) tripped it, first: {repo} "
                       f"({why})", err=True)
            sys.exit(1)
