"""`ckptinspect plan`: fit a checkpoint on GPUs and print SGLang / vLLM launch commands."""

from __future__ import annotations

from pathlib import Path

import click

from ckptinspect.cli.options import Command, check_gpu, gpu_list_help, quiet_option, wide_option
from ckptinspect.errors import PlanError

EXAMPLES = (
    "ckptinspect plan nvidia/Qwen3.5-397B-A17B-NVFP4 --gpu rtx-pro-6000 --gpus 8",
    "ckptinspect plan deepseek-ai/DeepSeek-V3 --gpu h200 --gpus 8 --context 32768 --engine sglang",
)


@click.command(cls=Command, examples=EXAMPLES, more_help=gpu_list_help)
@click.argument("model")
@click.option("--gpu", required=True, callback=check_gpu,
              help="GPU name or alias, e.g. rtx-pro-6000, b200, h200 (all names below).")
@click.option("--gpus", type=click.IntRange(1, 1024), required=True, help="Number of GPUs (TP size).")
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
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--rules-dir", "rules_dirs", multiple=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Extra MTP family rule files. Repeatable.")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit).")
@click.option("--token", default=None, envvar="HF_TOKEN", show_envvar=True, help="Hub token.")
@wide_option
@quiet_option
def plan(model: str, gpu: str, gpus: int, context: int | None, max_context: bool, concurrency: int, goal: str,
         engine: str, probe_report: Path | None, fmt: str, rules_dirs: tuple[Path, ...], revision: str | None,
         token: str | None, wide: bool, quiet: bool) -> None:
    """Plan MODEL on GPUS x GPU: TP/EP that loads, memory, KV capacity, launch commands with reasons."""
    from ckptinspect import api
    from ckptinspect.cli.options import output_width, progress_enabled
    from ckptinspect.render.plan_out import render_plan

    probe = api.read_probe_report(probe_report) if probe_report else None
    result = api.plan(model, gpu=gpu, gpus=gpus, context=context, goal=goal, engine=engine, probe_report=probe,
                      max_context=max_context, concurrency=concurrency, rules_dirs=rules_dirs, revision=revision,
                      token=token, progress=progress_enabled(quiet))
    if not result.ok:
        # Nothing runs: the JSON document still says why (status failed) for machines; exit 2 as before.
        if fmt == "json":
            click.echo(render_plan(result, "json"), nl=False)
        raise PlanError(result.message, hint=result.hint)
    click.echo(render_plan(result, fmt, width=output_width(fmt, wide)), nl=False)

