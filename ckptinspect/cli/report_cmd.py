"""`ckptinspect report`: thin wrapper over pipeline.build_report and the renderers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ckptinspect.records import VERDICT_RANK

FAIL_ON = {"degraded": VERDICT_RANK["degraded"], "unusable": VERDICT_RANK["unusable"]}
FAIL_ON_CHOICES = sorted(FAIL_ON) + ["error"]  # "error": any error-severity finding


@click.command()
@click.argument("model", required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--engine", type=click.Choice(["sglang", "vllm", "both"]), default="both", show_default=True,
              help="Engine(s) whose MTP verdict --fail-on checks.")
@click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), default=None,
              help="Exit 1 when the MTP verdict is this or worse, or (error) when any finding is an error "
                   "(CI gate for checkpoint uploads).")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Extra rule files (override built-in families by id). Repeatable.")
@click.option("--gpu", default=None, help="GPU name for a deployment plan (see `ckptinspect plan --help`).")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None, help="Number of GPUs for the plan.")
@click.option("--context", type=click.IntRange(1), default=None, help="Context length for the plan.")
@click.option("--tp", type=click.IntRange(1, 1024), default=None, help="Show the MTP layer's memory per GPU at this TP.")
@click.option("--ep", type=click.IntRange(1, 1024), default=None,
              help="Expert parallel size for --tp (default: TP); must divide --tp, as in SGLang.")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit).")
@click.option("--token", default=None, envvar="HF_TOKEN", show_envvar=True, help="Hub token.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--verbose", is_flag=True, help="Print request count, bytes fetched and timings to stderr.")
def report(model: str | None, fmt: str, engine: str, fail_on: str | None, rules_dirs: tuple[Path, ...],
           gpu: str | None, gpus: int | None, context: int | None, tp: int | None, ep: int | None,
           revision: str | None, token: str | None, quiet: bool, verbose: bool) -> None:
    """Inspect MODEL (a directory, org/name[@revision], or a .json.gz snapshot).

    Without MODEL, reports the bundled example (a tiny checkpoint with the layout of
    nvidia/Qwen3.5-397B-A17B-NVFP4). Reads config files and safetensors headers only.
    """
    from dataclasses import replace

    from ckptinspect.pipeline import build_report

    _check_parallel_options(tp, ep, gpu, gpus)
    if model is None:
        from ckptinspect.examples import EXAMPLE_DIR

        model = str(EXAMPLE_DIR)
    started = time.perf_counter()
    result = build_report(model, rules_dirs=rules_dirs, revision=revision, token=token,
                          progress=not quiet and fmt == "text")
    if tp is not None:
        from ckptinspect.readiness.cost import mtp_cost

        result = replace(result, mtp_costs=(mtp_cost(result.checkpoint, result.mtp, tp, ep or tp),))
    if gpu is not None:
        from ckptinspect.plan import plan_or_failure

        # A plan that cannot be made is a report section saying why; the exit code stays the report's.
        result = replace(result, plan=plan_or_failure(result.checkpoint, result.mtp, gpu=gpu, gpus=gpus,
                                                         context=context, engine=engine))

    if fmt == "json":
        from ckptinspect.render.json_out import dumps, report_to_json

        click.echo(dumps(report_to_json(result)))
    elif fmt == "markdown":
        from ckptinspect.render.text import render_markdown

        click.echo(render_markdown(result), nl=False)
    else:
        from ckptinspect.render.text import render_text

        click.echo(render_text(result), nl=False)
    if verbose:
        stats = dict(result.checkpoint.stats)
        stats["wall_s"] = round(time.perf_counter() - started, 3)
        click.echo("stats: " + ", ".join(f"{k}={v}" for k, v in stats.items()), err=True)
    if fail_on == "error":
        errors = [f for f in (*result.checkpoint.findings, *(result.mtp.findings if result.mtp else ()))
                  if f.severity == "error"]
        if errors:
            click.echo(f"fail-on error: {len(errors)} error finding(s), first: {errors[0].code}", err=True)
            sys.exit(1)
    elif fail_on is not None and result.mtp is not None:
        engines = ("sglang", "vllm") if engine == "both" else (engine,)
        worst = [e for e in engines if e in result.mtp.verdicts
                 and VERDICT_RANK[result.mtp.verdicts[e].verdict] >= FAIL_ON[fail_on]]
        if worst:
            verdicts = ", ".join(f"{e}={result.mtp.verdicts[e].verdict}" for e in worst)
            click.echo(f"fail-on {fail_on}: MTP verdict {verdicts}", err=True)
            sys.exit(1)


def _check_parallel_options(tp: int | None, ep: int | None, gpu: str | None, gpus: int | None) -> None:
    """Refuse what the engines refuse before reading the checkpoint (usage error, exit 2)."""
    if ep is not None and tp is None:
        raise click.UsageError("--ep needs --tp: the expert-parallel size splits the --tp ranks")
    if tp is not None:
        from ckptinspect.plan import split_problem

        problem = split_problem(tp, ep)
        if problem:
            raise click.UsageError(problem)
    if (gpu is None) != (gpus is None):
        raise click.UsageError("--gpu and --gpus go together")
    if gpu is not None:
        from ckptinspect.plan import find_gpu

        find_gpu(gpu)  # a bad GPU name is an input error, not a failed plan
