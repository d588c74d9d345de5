"""``ckptinspect verify MODEL --engine {sglang,vllm}``: the MTP draft dry-loaded through the engine's own code."""

from __future__ import annotations

import click

from ckptinspect.cli.options import Command, checkpoint_options, current_settings, engine_env_options, not_applicable

EXAMPLES = (
    "ckptinspect verify nvidia/Qwen3.5-397B-A17B-NVFP4 --engine vllm          # vLLM installed in this Python",
    "ckptinspect verify ./DeepSeek-V3 --engine vllm --engine-python ~/vllm-env/bin/python",
    "ckptinspect verify ./DeepSeek-V3 --engine sglang --engine-python /opt/sglang/bin/python --format json",
)


@click.command("verify", cls=Command, examples=EXAMPLES)
@click.argument("model")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), required=True,
              help="The engine whose own code builds and loads the draft.")
@engine_env_options
@click.option("--method", type=str, default=None,
              help="The engine's speculative method (default: vLLM 'mtp', SGLang 'NEXTN').")
@click.option("--trust-remote-code", is_flag=True, help="Let the engine run the checkpoint's own config code.")
@checkpoint_options()
def verify(model: str, engine: str, engine_python: str | None, engine_pythonpath: str | None, method: str | None,
           trust_remote_code: bool, fmt: str, revision: str | None, token: str | None, quiet: bool,
           verbose: bool) -> None:
    """Build MODEL's MTP / NextN draft with the engine's own code on the meta device (no GPU, no weights)
    and run the engine's own weight loading over the stored tensors' names, dtypes and shapes (headers
    only). Prints, per module, the parameters the engine built, what loaded into them, what it skipped and
    never loaded, and the engine's exception where loading fails. --deadline bounds the whole run.

    Exit codes: 0 the engine answered (whatever the outcome); 2 the engine's environment is missing, broken
    or did not answer in time (one line).
    """
    from ckptinspect import api
    from ckptinspect.cli.options import progress_enabled
    from ckptinspect.render.verify_out import render_verify

    if fmt == "markdown":
        raise not_applicable("verify", "--format markdown", "its output is text or JSON")
    # --deadline / CKPTINSPECT_DEADLINE_S, parsed once into the command's Settings (cli/options.py)
    result = api.verify(model, engine, engine_python=engine_python, engine_pythonpath=engine_pythonpath,
                        deadline=current_settings().deadline_s, revision=revision, token=token,
                        progress=progress_enabled(quiet), method=method, trust_remote_code=trust_remote_code,
                        settings=current_settings())
    click.echo(render_verify(result, fmt))
    if verbose:
        click.echo(f"verify: {result.engine} {result.engine_version} answered in {result.seconds:.1f} s", err=True)
