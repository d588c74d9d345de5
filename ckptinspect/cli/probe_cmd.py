"""``ckptinspect probe``: measure MTP draft acceptance against the main model (needs the 'probe' extra).

torch / transformers are imported inside the command body only, so ``ckptinspect --help`` and
``report`` stay torch-free.
"""

from __future__ import annotations

import os

import click

from ckptinspect.cli.options import (GPU_SPEC_HELP, Command, checkpoint_options, current_settings, gpu_spec_setting,
                                     not_applicable, wide_option)
from ckptinspect.errors import ProbeError

EXAMPLES = (
    "ckptinspect probe ./Qwen3.5-35B-A3B --steps 3 --max-prompts 32          # one GPU",
    "ckptinspect probe ./DeepSeek-V3 --devices 0,1,2,3 --format json -o probe.json",
)


def _parse_devices(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ProbeError(f"--devices takes GPU indices like 0,1 (got {text!r})") from exc


@click.command("probe", cls=Command, examples=EXAMPLES, refused=("--token",), formats=("text", "json"))
@click.argument("model")
@click.option("--device", default=None, help="cuda:N or cpu (default: cuda:0 when a GPU is visible, else cpu).")
@click.option("--devices", default=None, help="Spread the main model over these GPU indices, e.g. 0,1.")
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False),
              help=".txt (one prompt per line) or .jsonl ({prompt, category}); default: built-in set.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(4, 8192))
@click.option("--steps", "-k", default=3, show_default=True, type=click.IntRange(1, 16),
              help="Draft depth K (the one MTP layer chained K times).")
@click.option("--mode", type=click.Choice(["greedy", "teacher"]), default="greedy", show_default=True)
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Temperature of the sampled-acceptance estimate sum(min(p, q)).")
@click.option("--gpu", default="H200", show_default=True, help="GPU name, alias or nvidia-smi name for the cost model.")
@click.option("--gpu-spec", type=click.Path(dir_okay=False), default=None, callback=gpu_spec_setting,
              metavar="FILE", help=GPU_SPEC_HELP)
@click.option("--batch-size", default=None, type=click.IntRange(1, 4096),
              help="Sequences per batch (default: as many as the memory estimate fits in 90% of the free device "
              "memory; teacher mode sizes each batch of its length-sorted sequences that way).")
@click.option("--categories", default=None, help="Only prompts of these categories, e.g. code,math (built-in: chat, "
              "code, math, reasoning, summarisation, multilingual; 'synthetic' adds benchmark-style token-id "
              "prompts, see docs/probe.md).")
@click.option("--synthetic-len", default=1024, show_default=True, type=click.IntRange(2, 131072),
              help="Tokens per prompt of the synthetic category (vLLM / SGLang random datasets default to 1024).")
@click.option("--experts-implementation", type=click.Choice(["auto", "eager", "grouped_mm", "batched_mm"]),
              default="auto", show_default=True,
              help="transformers' MoE experts kernels; auto = its default (grouped_mm, batched_mm while decoding on GPU).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default=None,
              help="Compute dtype (default bf16 on GPU, fp32 on CPU).")
@click.option("--output", "-o", default=None, type=click.Path(dir_okay=False), help="Write the result here.")
@click.option("--plot", default=None, type=click.Path(dir_okay=False), help="Write a PNG of acceptance and speedup.")
@click.option("--main-url", default=None, help="Use a running SGLang server (--enable-return-hidden-states) as main model.")
@click.option("--engine", default=None, callback=lambda ctx, param, value: _engine_name(value), metavar="[sglang|vllm]",
              help="Measure acceptance through a running SGLang or vLLM server started with MTP speculative "
              "decoding (its own counts; vLLM: --per-request-spec-decode-metrics detailed); the server is at "
              "--engine-url, default the engine's own port on localhost (SGLang 30000, vLLM 8000).")
@click.option("--engine-url", default=None, metavar="URL",
              help="The running engine's address, e.g. http://host:8000 or localhost:30000 (the engine is "
              "detected when --engine is not given).")
@click.option("--trust-remote-code", is_flag=True, help="Allow the checkpoint's own Python code (never implied).")
@click.option("--max-prompts", default=None, type=click.IntRange(1), help="Use only the first N prompts.")
@click.option("--corpus", default=None, type=click.Path(dir_okay=False),
              help="Teacher mode: score this text (.txt, documents split at blank lines; .jsonl with 'text').")
@click.option("--save-continuations", default=None, type=click.Path(dir_okay=False),
              help="Greedy mode: also write the main model's greedy continuations here (.jsonl).")
@click.option("--continuations", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Teacher mode: score continuations saved by --save-continuations (no generation).")
@click.option("--max-gpu-memory", default=None, type=click.FloatRange(min=0.0, min_open=True),
              help="GiB the main model may use on the device; a model over it is layer-streamed (teacher mode).")
@click.option("--cost-calibration", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Cost-model efficiencies measured on the GPU (JSON written by benchmarks/probe_gpu.py).")
@checkpoint_options()
@wide_option
def probe(model: str, device: str | None, devices: str | None, prompts_file: str | None, max_new_tokens: int,
          steps: int, mode: str, temperature: float, gpu: str, gpu_spec: str | None, batch_size: int | None,
          categories: str | None,
          synthetic_len: int,
          experts_implementation: str, dtype: str | None,
          output: str | None, plot: str | None, main_url: str | None, engine: str | None, engine_url: str | None,
          trust_remote_code: bool,
          max_prompts: int | None, corpus: str | None, save_continuations: str | None, continuations: str | None,
          max_gpu_memory: float | None, cost_calibration: str | None, fmt: str, revision: str | None,
          token: str | None, quiet: bool, verbose: bool, wide: bool) -> None:
    """Measure how well MODEL's MTP head drafts for its own main model (acceptance per depth,
    accept length, projected speedup, recommended speculative settings)."""
    import time

    from ckptinspect import api
    from ckptinspect.cli.options import progress_enabled

    started = time.perf_counter()
    model = _with_revision(model, revision)
    if token is not None and click.get_current_context().get_parameter_source("token") == \
            click.core.ParameterSource.COMMANDLINE:
        raise not_applicable("probe", "--token", "it reads the weights from a local directory or the HF cache, "
                                                 "never from the network (download them first)")
    if fmt == "markdown":
        raise not_applicable("probe", "--format markdown", "the probe writes text or json")
    # before anything runs: no output may land in the model directory or name a directory
    api.check_probe_outputs(model, {"-o": output, "--plot": plot, "--save-continuations": save_continuations})
    gpu = api.find_gpu(gpu, spec_file=gpu_spec)  # an unknown name fails here, before torch loads
    progress = progress_enabled(quiet)
    # The probe's batches vary in shape; without expandable segments the CUDA cache fragments (a
    # 26 GiB block failed with 44 GiB reserved but free, BENCHMARKS.md section 11). Read at torch's
    # first CUDA allocation, so it is set before the import; a user's own setting wins.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ProbeError(api.probe_install_hint(exc.name)) from exc
    transformers.logging.set_verbosity_error()
    if not progress:
        transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cats = tuple(c.strip() for c in categories.split(",") if c.strip()) if categories else None
    if engine or engine_url:  # the engine measures: the options it reads; K is the server's unless given
        explicit = click.get_current_context().get_parameter_source("steps") != click.core.ParameterSource.DEFAULT
        options = api.ProbeOptions(engine=engine_address(engine, engine_url), engine_kind=engine,
                                   prompts=prompts_file, max_new_tokens=max_new_tokens,
                                   steps=steps if explicit else None, mode=mode, main_url=main_url, gpu=gpu,
                                   trust_remote_code=trust_remote_code, max_prompts=max_prompts,
                                   cost_calibration=cost_calibration, categories=cats)
    else:
        if device is None:
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        options = api.ProbeOptions(device=device,
                                   devices=_parse_devices(devices), prompts=prompts_file,
                                   max_new_tokens=max_new_tokens, steps=steps, mode=mode, temperature=temperature,
                                   gpu=gpu, trust_remote_code=trust_remote_code, batch_size=batch_size, dtype=dtype,
                                   progress=progress, main_url=main_url, max_prompts=max_prompts, corpus=corpus,
                                   continuations=continuations, save_continuations_to=save_continuations,
                                   max_gpu_memory=max_gpu_memory, cost_calibration=cost_calibration,
                                   categories=cats, experts_implementation=experts_implementation,
                                   synthetic_len=synthetic_len)
    _emit(api.probe(model, options, current_settings()), fmt, output, plot, wide)
    _verbose(verbose, started)


ENGINES = ("sglang", "vllm")
# Where each engine listens unless told otherwise (SGLang: --port 30000, SG:arg_groups/fields/server.py;
# vLLM: --port 8000, VL:entrypoints/openai/cli_args.py).
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}


def _engine_name(value: str | None) -> str | None:
    """``--engine`` is an engine name, as in every other command; a URL there says where it goes."""
    if value is None or value in ENGINES:
        return value
    if "://" in value or ":" in value or "/" in value or "localhost" in value:
        import re

        shown = re.sub(r"://[^/?#\s@]*@", "://", value)  # a password in the URL is never echoed
        raise click.BadParameter(f"{shown!r} is an address: --engine takes the engine's name (sglang or vllm); "
                                 f"give the address as --engine-url {shown}", param_hint="--engine")
    raise click.BadParameter(f"{value!r} is not an engine (choose from sglang, vllm)", param_hint="--engine")


def engine_address(engine: str | None, url: str | None) -> str:
    """The engine's base URL: --engine-url (a scheme added when missing: 'localhost:8000'), else the named
    engine's default port on localhost."""
    if url is None:
        return f"http://localhost:{DEFAULT_PORTS[engine]}" if engine else ""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def _with_revision(model: str, revision: str | None) -> str:
    """``--revision REV`` is ``MODEL@REV`` (the probe finds a Hub repo's weights in the HF cache)."""
    if revision is None:
        return model
    if os.path.isdir(model):
        raise not_applicable("probe", "--revision", f"{model!r} is a local directory, not a Hub repo id")
    if "@" in model:
        if model.rsplit("@", 1)[1] != revision:
            raise click.UsageError(f"{model!r} names a revision and --revision says {revision!r}")
        return model
    return f"{model}@{revision}"


def _verbose(verbose: bool, started: float) -> None:
    if verbose:
        import time

        from ckptinspect.render.stats_out import stats_line

        click.echo(stats_line({}, time.perf_counter() - started), err=True)


def _emit(result, fmt: str, output: str | None, plot: str | None, wide: bool) -> None:
    from ckptinspect.cli.options import output_width
    from ckptinspect.render.probe_out import render_probe

    text = render_probe(result, fmt, width=None if output else output_width(fmt, wide))
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        click.echo(text)
    if plot:
        from ckptinspect.render.probe_plot import write_probe_plot

        write_probe_plot(result, plot)
