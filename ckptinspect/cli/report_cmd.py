"""`ckptinspect report`: parse the options, call ckptinspect.api.inspect, render, apply the gate."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ckptinspect.api import FAIL_ON, FAIL_ON_CHOICES
from ckptinspect.cli.options import (Command, checkpoint_options, gpu_file_options, gpu_list_help, resolve_gpu,
                                     verify_engine_options, wide_option)

EXAMPLES = (
    "ckptinspect report                                        # the bundled example",
    "ckptinspect report nvidia/Qwen3.5-397B-A17B-NVFP4 --gpu rtx-pro-6000 --gpus 8",
    "ckptinspect report ./my-quant --fail-on unusable --engine sglang --verify-engine sglang   # CI gate: exit 1",
)


@click.command(cls=Command, examples=EXAMPLES, more_help=gpu_list_help)
@click.argument("model", required=False)
@click.option("--engine", type=click.Choice(["sglang", "vllm", "both"]), default="both", show_default=True,
              help="Engine(s) whose MTP verdict --fail-on checks.")
@click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), default=None,
              help="Exit 1 when the MTP verdict is this or worse, or (error) when any finding is an error "
                   "(CI gate for checkpoint uploads).")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Extra rule files (override built-in families by id). Repeatable.")
@click.option("--gpu", default=None, help="GPU name, alias or nvidia-smi name for a deployment plan (listed below; "
              "'8x NAME' sets --gpus).")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None, help="Number of GPUs for the plan.")
@gpu_file_options
@click.option("--context", type=click.IntRange(1), default=None, help="Context length for the plan.")
@click.option("--tp", type=click.IntRange(1, 1024), default=None, help="Show the MTP layer's memory per GPU at this TP.")
@click.option("--ep", type=click.IntRange(1, 1024), default=None,
              help="Expert parallel size for --tp (default: TP); must divide --tp, as in SGLang.")
@click.option("--engine-version", "engine_versions", multiple=True, metavar="ENGINE=VERSION",
              help="Answer for this engine release instead of the newest the rules know (e.g. vllm=0.33.0).")
@verify_engine_options
@checkpoint_options()
@wide_option
def report(model: str | None, engine: str, fail_on: str | None, rules_dirs: tuple[Path, ...],
           gpu: str | None, gpus: int | None, gpu_spec: Path | None, gpu_memory: float | None,
           context: int | None, tp: int | None, ep: int | None, engine_versions: tuple[str, ...],
           verify_engine: str | None, engine_python: str | None, engine_pythonpath: str | None, fmt: str,
           revision: str | None, token: str | None, quiet: bool, verbose: bool, wide: bool) -> None:
    """Inspect MODEL (a directory, org/name[@revision], a .json.gz snapshot, or a GGUF model: a .gguf
    file, DIR:TAG, org/repo:TAG; see docs/gguf.md).

    Without MODEL, reports the bundled example (a tiny checkpoint with the layout of
    nvidia/Qwen3.5-397B-A17B-NVFP4). Reads config files and safetensors headers only.
    """
    from ckptinspect import api
    from ckptinspect.cli.options import colour_enabled, current_settings, output_width, progress_enabled
    from ckptinspect.render.report import render_report

    started = time.perf_counter()
    spec, gpus = resolve_gpu(gpu, gpus, gpu_spec, gpu_memory)
    _check_parallel_options(tp, ep, spec, gpus)
    result = api.inspect(model, rules_dirs=rules_dirs, revision=revision, token=token,
                         progress=progress_enabled(quiet), tp=tp, ep=ep, gpu=spec, gpus=gpus, context=context,
                         engine=engine, engine_versions=_engine_versions(engine_versions),
                         verify_engine=verify_engine, engine_python=engine_python,
                         engine_pythonpath=engine_pythonpath, settings=current_settings())
    click.echo(render_report(result, fmt, width=output_width(fmt, wide), colour=colour_enabled()), nl=False)
    if verbose:
        from ckptinspect.render.stats_out import stats_line

        click.echo(stats_line(result.checkpoint.stats, time.perf_counter() - started), err=True)
    if fail_on is not None:
        tripped = api.gate(result, fail_on, engine)
        if tripped:
            if fail_on in FAIL_ON:
                click.echo(f"fail-on {fail_on}: MTP verdict {', '.join(tripped)}", err=True)
            else:
                click.echo(f"fail-on error: {len(tripped)} error finding(s), first: {tripped[0]}", err=True)
            sys.exit(1)


def _engine_versions(values: tuple[str, ...]) -> dict[str, str] | None:
    """``--engine-version vllm=0.33.0`` (repeatable) -> {"vllm": "0.33.0"}; a malformed value is a usage error."""
    import re

    out = {}
    for value in values:
        name, _, version = value.partition("=")
        if name not in ("sglang", "vllm") or not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
            raise click.BadParameter(f"{value!r} is not ENGINE=VERSION (sglang or vllm, e.g. vllm=0.33.0)",
                                     param_hint="--engine-version")
        out[name] = version
    return out or None


def _check_parallel_options(tp: int | None, ep: int | None, gpu: object, gpus: int | None) -> None:
    """Refuse what the engines refuse before reading the checkpoint (usage error, exit 2)."""
    if ep is not None and tp is None:
        raise click.UsageError("--ep needs --tp: the expert-parallel size splits the --tp ranks")
    from ckptinspect import api

    if tp is not None:
        problem = api.split_problem(tp, ep)
        if problem:
            raise click.UsageError(problem)
    if (gpu is None) != (gpus is None):
        raise click.UsageError("--gpu and --gpus go together (or --gpu '8x NAME')")
