"""Conventions every command shares: progress bars, output width, colour, GPU names.

- Progress bars (huggingface_hub's conventions): only when stderr is a terminal, never with
  ``HF_HUB_DISABLE_PROGRESS_BARS`` set to a true value, never with ``--quiet``.
- Width: human text wraps to ``COLUMNS`` or the terminal (80 when neither is known); ``--wide`` gives
  full width. JSON and markdown are never wrapped (a markdown table cannot wrap a cell).
- Colour: verdicts and severities are coloured only when stdout is a terminal and ``NO_COLOR`` is
  unset or empty (https://no-color.org).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import click

from ckptinspect.settings import BY_FIELD, Settings, SettingsError, parse

_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants._is_true


def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in _TRUE


def progress_enabled(quiet: bool, stream: Any = None) -> bool:
    """A progress bar goes to ``stream`` (stderr) only when a person is watching it."""
    stream = sys.stderr if stream is None else stream
    return not quiet and not env_true("HF_HUB_DISABLE_PROGRESS_BARS") and _isatty(stream)


def colour_enabled(stream: Any = None) -> bool:
    stream = sys.stdout if stream is None else stream
    return not os.environ.get("NO_COLOR") and _isatty(stream)


def output_width(fmt: str, wide: bool) -> int | None:
    """Columns for human text (None: full width)."""
    if wide or fmt != "text":
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(40, int(columns))
    if not _isatty(sys.stdout):
        # A pipe or a file has no width: wrapping at a guessed 80 columns split flags and paths in
        # what people copy from logs and grep (issue 26 item 8).
        return None
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


# -- options every command that reads a checkpoint shares (same names, types and help everywhere;
# tests/test_cli_conventions.py walks the commands) -------------------------------------------------
QUIET_HELP = ("No progress bar or summary line (the bar is also off when stderr is not a terminal or "
              "HF_HUB_DISABLE_PROGRESS_BARS=1).")
VERBOSE_HELP = "Print requests, bytes fetched, retries and wall time to stderr (a line per checkpoint read)."
REVISION_HELP = "Hub revision (branch, tag or 40-hex commit); the same as MODEL@REVISION."
TOKEN_HELP = "Hugging Face access token for gated or private repos."
FORMAT_HELP = "Output format."
DEADLINE_HELP = (f"Deadline for all Hub requests of the command (default {BY_FIELD['deadline_s'].default}; "
                 "env CKPTINSPECT_DEADLINE_S).")
REQUEST_TIMEOUT_HELP = (f"Deadline for one Hub request's whole answer (default {BY_FIELD['request_timeout_s'].default}; "
                        "env CKPTINSPECT_REQUEST_TIMEOUT_S).")
FORMATS = ("text", "json", "markdown")


def quiet_option(f: Callable) -> Callable:
    return click.option("--quiet", "-q", is_flag=True, help=QUIET_HELP)(f)


def verbose_option(f: Callable) -> Callable:
    return click.option("--verbose", "-v", is_flag=True, help=VERBOSE_HELP)(f)


def revision_option(f: Callable) -> Callable:
    return click.option("--revision", default=None, metavar="REV", help=REVISION_HELP)(f)


def token_option(f: Callable) -> Callable:
    return click.option("--token", default=None, envvar="HF_TOKEN", show_envvar=True, metavar="TOKEN",
                        help=TOKEN_HELP)(f)


def format_option(*extra: str) -> Callable[[Callable], Callable]:
    """``--format`` with text, json and markdown (and a command's ``extra`` formats, e.g. jsonl)."""
    return click.option("--format", "fmt", type=click.Choice([*FORMATS, *extra]), default="text",
                        show_default=True, help=FORMAT_HELP)


# -- settings (ckptinspect/settings.py): built once by main(), kept in the root context's obj; a flag
# that sets one is parsed by the same code as its variable ------------------------------------------
def current_settings(ctx: click.Context | None = None) -> Settings:
    """The command's settings: the flags given so far over the environment over the defaults. main()
    builds them before click runs; a command invoked without main() (click's test runner) builds them
    from the environment the first time they are asked for."""
    root = (ctx or click.get_current_context()).find_root()
    if root.obj is None:
        root.obj = {}
    if "settings" not in root.obj:
        root.obj["settings"] = Settings.from_environ()
    return root.obj["settings"]


class SettingType(click.ParamType):
    """A flag's value parsed exactly as its environment variable (same bounds; no nan, inf or 1e309)."""

    def __init__(self, field: str) -> None:
        self.variable = BY_FIELD[field]
        self.name = self.variable.kind

    def convert(self, value: Any, param: Any, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse(self.variable, value)
        except SettingsError as exc:
            self.fail(exc.detail, param, ctx)


def setting_type(field: str) -> SettingType:
    return SettingType(field)


def apply_flag(field: str) -> Callable[[click.Context, Any, Any], Any]:
    """A callback that puts a given flag's value into the command's settings."""
    def callback(ctx: click.Context, param: Any, value: Any) -> Any:
        if value is not None:
            ctx.find_root().obj["settings"] = replace(current_settings(ctx), **{field: value})
        return value
    return callback


def network_options(f: Callable) -> Callable:
    """``--deadline`` and ``--request-timeout``, after the subcommand as before it (the group has them too)."""
    f = click.option("--request-timeout", type=setting_type("request_timeout_s"), default=None,
                     metavar="SECONDS", expose_value=False, callback=apply_flag("request_timeout_s"),
                     help=REQUEST_TIMEOUT_HELP)(f)
    return click.option("--deadline", type=setting_type("deadline_s"), default=None,
                        metavar="SECONDS", expose_value=False, callback=apply_flag("deadline_s"),
                        help=DEADLINE_HELP)(f)


def checkpoint_options(*formats: str) -> Callable[[Callable], Callable]:
    """The shared set: --format (text, json, markdown + ``formats``), --revision, --token, --quiet,
    --verbose, --deadline, --request-timeout."""
    def decorate(f: Callable) -> Callable:
        for option in (network_options, verbose_option, quiet_option, token_option, revision_option,
                       format_option(*formats)):
            f = option(f)
        return f
    return decorate


def not_applicable(command: str, option: str, why: str) -> click.UsageError:
    """The one-line error for a shared option a command cannot honour (docs/cli.md lists them)."""
    return click.UsageError(f"{option} does not apply to {command}: {why}")


def wide_option(f: Callable) -> Callable:
    return click.option("--wide", is_flag=True,
                        help="Full-width text; by default text wraps to COLUMNS or the terminal width.")(f)


# -- the engine's environment (verify; report / audit --verify-engine) ------------------------------
ENGINE_PYTHON_HELP = ("Python of the environment the engine is installed in (default: this Python, if it has the "
                      "engine).")
ENGINE_PYTHONPATH_HELP = "PYTHONPATH for the engine's Python (an engine installed with pip --target)."


def engine_env_options(f: Callable) -> Callable:
    """--engine-python / --engine-pythonpath, as verify has them."""
    f = click.option("--engine-pythonpath", type=str, default=None, metavar="DIRS", help=ENGINE_PYTHONPATH_HELP)(f)
    return click.option("--engine-python", type=str, default=None, metavar="PATH", help=ENGINE_PYTHON_HELP)(f)


def verify_engine_options(f: Callable) -> Callable:
    """report / audit --verify-engine ENGINE with verify's --engine-python / --engine-pythonpath."""
    f = engine_env_options(f)
    return click.option("--verify-engine", type=click.Choice(["sglang", "vllm"]), default=None,
                        help="Also dry-load the MTP draft through this engine's own code (as `verify`; no GPU) "
                             "and let its answer decide that engine's verdict; the rules judge its installed "
                             "version, and where they disagree a rules-disagree-with-engine warning names the "
                             "modules. No engine environment: exit 2.")(f)


# -- GPU options ------------------------------------------------------------------------------------
GPU_SPEC_HELP = ("A YAML / JSON file of GPU entries in rules/gpus.yaml's schema: adds cards, or replaces "
                 "catalog cards of the same name (env CKPTINSPECT_GPU_SPEC).")
GPU_MEMORY_HELP = ("Usable GiB per GPU instead of the card's (a MIG slice, a card shared with other jobs); "
                   "fit, KV capacity and TP / EP all use it.")


def gpu_file_options(f: Callable) -> Callable:
    f = click.option("--gpu-memory", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GIB",
                     help=GPU_MEMORY_HELP)(f)
    return click.option("--gpu-spec", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        callback=gpu_spec_setting, metavar="FILE", help=GPU_SPEC_HELP)(f)


def gpu_spec_setting(ctx: click.Context, param: Any, value: Any) -> Any:
    """--gpu-spec, else the settings' CKPTINSPECT_GPU_SPEC."""
    return value if value is not None else current_settings(ctx).gpu_spec


def resolve_gpu(gpu: str | None, gpus: int | None, gpu_spec: Path | None,
                gpu_memory: float | None) -> tuple[Any, int | None]:
    """(GpuSpec or None, GPU count) from --gpu ("h200", "NVIDIA H200", "8x NVIDIA H200"), --gpus,
    --gpu-spec and --gpu-memory; every problem is a one-line error (exit 2) before any checkpoint is read."""
    from ckptinspect.api import find_gpu, split_gpu_count

    if gpu is None:
        if gpu_memory is not None:
            raise click.UsageError("--gpu-memory needs --gpu (the card whose memory it replaces)")
        return None, gpus
    count, name = split_gpu_count(gpu)
    if count is not None:
        if count < 1:
            raise click.UsageError(f"--gpu {gpu!r}: the GPU count must be at least 1")
        if gpus is not None and gpus != count:
            raise click.UsageError(f"--gpu {gpu!r} says {count} GPUs but --gpus says {gpus}")
        gpus = count
    return find_gpu(name, spec_file=gpu_spec, memory_gib=gpu_memory), gpus


def gpu_catalog_help() -> str:
    """What people type for each GPU (its first alias, else its catalog name), comma-separated."""
    from ckptinspect.api import gpus

    return ", ".join(g.aliases[0] if g.aliases else g.name for g in gpus())


class SuggestingChoice(click.Choice):
    """A choice whose error names the closest valid value (click already does this for commands and
    option names, not for values: `--format jsn`, `--engine sglng`)."""

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        import difflib

        message = super().get_invalid_choice_message(value, ctx)
        close = difflib.get_close_matches(str(value).lower(), [str(c) for c in self.choices], n=1, cutoff=0.6)
        return f"{message} Did you mean {close[0]!r}?" if close else message


class Command(click.Command):
    """A click command whose help ends with real examples (and, lazily, any extra text such as the
    GPU catalog, so that importing the command stays cheap); a mistyped choice value gets a suggestion."""

    def __init__(self, *args: Any, examples: tuple[str, ...] = (), more_help: Callable[[], tuple[str, str]] | None = None,
                 refused: tuple[str, ...] = (), formats: tuple[str, ...] | None = None, **kwargs: Any) -> None:
        """``refused``: shared options this command refuses (docs/cli.md, "Where an option does not apply"):
        kept, so using one says why, but left out of --help; ``formats``: the --format values it writes."""
        super().__init__(*args, **kwargs)
        self.examples = examples
        self.more_help = more_help
        for param in self.params:
            if type(param.type) is click.Choice:
                param.type = SuggestingChoice(param.type.choices, case_sensitive=param.type.case_sensitive)
            if isinstance(param, click.Option) and any(o in refused for o in param.opts):
                param.hidden = True
            elif formats is not None and isinstance(param, click.Option) and "--format" in param.opts:
                param.metavar = "[" + "|".join(formats) + "]"

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.examples:
            with formatter.section("Examples"):
                for example in self.examples:  # written as is: an example must stay copy-pasteable
                    formatter.write(" " * formatter.current_indent + example + "\n")
        if self.more_help is not None:
            title, text = self.more_help()
            with formatter.section(title):
                width = max(40, (formatter.width or 80) - formatter.current_indent)
                for line in textwrap.wrap(text, width=width, break_on_hyphens=False):  # keep names whole
                    formatter.write(" " * formatter.current_indent + line + "\n")
        super().format_epilog(ctx, formatter)


def gpu_list_help() -> tuple[str, str]:
    return ("GPU names (rules/gpus.yaml)", gpu_catalog_help() + "; case, space and '_' insensitive; "
            "nvidia-smi's names and '8x NAME' work too; other cards: --gpu-spec FILE")
