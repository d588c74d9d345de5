"""`ckptinspect plan`: fit a checkpoint on GPUs and print SGLang / vLLM launch commands."""

from __future__ import annotations

from pathlib import Path

import click

from ckptinspect.cli.options import Command, checkpoint_options, gpu_file_options, gpu_list_help, resolve_gpu, wide_option
from ckptinspect.errors import PlanNotPossible

EXAMPLES = (
    "ckptinspect plan nvidia/Qwen3.5-397B-A17B-NVFP4 --gpu rtx-pro-6000 --gpus 8",
    "ckptinspect plan deepseek-ai/DeepSeek-V3 --gpu h200 --gpus 8 --context 32768 --engine sglang",
    "ckptinspect plan Qwen/Qwen3.5-35B-A3B --gpu \"NVIDIA H100 80GB HBM3\" --gpus 1 --gpu-memory 40",
)


@click.command(cls=Command, examples=EXAMPLES, more_help=gpu_list_help)
@click.argument("model")
@click.option("--gpu", required=True,
              help="GPU name, alias or nvidia-smi name, e.g. rtx-pro-6000, b200, \"NVIDIA H200\", \"8x NVIDIA H200\" "
                   "(all names below).")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None,
              help="Number of GPUs (TP size); may be given in --gpu as '8x NAME'.")
@gpu_file_options
@click.option("--context", type=click.IntRange(1), default=None, help="Context length in tokens (default: the model's max).")
@click.option("--max-context", "max_context", is_flag=True,
              help="Solve for the longest context --concurrency requests get (also used when the default does not fit).")
@click.option("--concurrency", type=click.IntRange(1), default=1, show_default=True,
              help="Concurrent requests the max-context solver sizes the KV pool for.")
@click.option("--goal", type=click.Choice(["latency", "throughput"]), default="latency", show_default=True)
@click.option("--engine", type=click.Choice(["sglang", "vllm", "both", "llamacpp"]), default="both", show_default=True,
              help="Engine(s) to plan for; a GGUF checkpoint is planned for llama.cpp (llamacpp).")
@click.option("--probe-report", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Probe JSON whose recommendation sets the speculative steps / draft tokens.")
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Extra MTP family rule files. Repeatable.")
@checkpoint_options()
@wide_option
def plan(model: str, gpu: str, gpus: int | None, gpu_spec: Path | None, gpu_memory: float | None,
         context: int | None, max_context: bool, concurrency: int, goal: str, engine: str,
         probe_report: Path | None, rules_dirs: tuple[Path, ...], fmt: str, revision: str | None,
         token: str | None, quiet: bool, verbose: bool, wide: bool) -> None:
    """Plan MODEL on GPUS x GPU: TP/EP that loads, memory, KV capacity, launch commands with reasons."""
    import time

    from ckptinspect import api
    from ckptinspect.cli.options import current_settings, output_width, progress_enabled
    from ckptinspect.render.plan_out import render_plan

    started = time.perf_counter()
    spec, gpus = resolve_gpu(gpu, gpus, gpu_spec, gpu_memory)
    if gpus is None:
        raise click.UsageError("give the GPU count: --gpus N, or --gpu '8x NAME'")
    probe = api.read_probe_report(probe_report) if probe_report else None
    stats: dict = {}

    def show_stats() -> None:
        if verbose:
            from ckptinspect.render.stats_out import stats_line

            click.echo(stats_line(stats, time.perf_counter() - started), err=True)

    try:
        result = api.plan(model, gpu=spec, gpus=gpus, context=context, goal=goal, engine=engine,
                          probe_report=probe, max_context=max_context, concurrency=concurrency,
                          rules_dirs=rules_dirs, revision=revision, token=token,
                          progress=progress_enabled(quiet), stats=stats, settings=current_settings())
    except PlanNotPossible as exc:
        # Nothing runs: the JSON document still says why (status failed) for machines; exit 2.
        show_stats()
        if fmt == "json":
            click.echo(render_plan(exc.failure, "json"), nl=False)
        raise
    show_stats()
    click.echo(render_plan(result, fmt, width=output_width(fmt, wide)), nl=False)
