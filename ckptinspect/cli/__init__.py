"""Command-line entry point.

Each subcommand lives in its own module and is imported only when invoked, so
``ckptinspect --help`` stays fast and ``report`` never pulls in torch.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import replace
from typing import Any

import click

from ckptinspect.settings import Settings, SettingsError
from ckptinspect.cli.options import DEADLINE_HELP, REQUEST_TIMEOUT_HELP, apply_flag, current_settings, setting_type

# name -> (module:attribute, one-line help shown by `ckptinspect --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "report": ("ckptinspect.cli.report_cmd:report", "Inspect a checkpoint: tensors, quantization, MTP readiness."),
    "diff": ("ckptinspect.cli.diff_cmd:diff", "Compare two checkpoints (e.g. BF16 original vs its quant)."),
    "rules": ("ckptinspect.cli.rules_cmd:rules", "List, show and validate MTP family rule files."),
    "plan": ("ckptinspect.cli.plan_cmd:plan", "Fit a checkpoint on GPUs and print SGLang / vLLM launch commands."),
    "snapshot": ("ckptinspect.cli.snapshot_cmd:snapshot", "Save all metadata of a checkpoint into one .json.gz file."),
    "probe": ("ckptinspect.cli.probe_cmd:probe", "Measure MTP draft acceptance on a GPU (needs the 'probe' extra)."),
    "audit": ("ckptinspect.cli.audit_cmd:audit", "Audit many repos at once (e.g. every quant of a base model)."),
    "verify": ("ckptinspect.cli.verify_cmd:verify", "Dry-load the MTP draft through SGLang's / vLLM's own code (no GPU)."),
}


# The exit codes every command follows (docs/cli.md, "Exit codes"; tests/test_exit_codes.py).
EXIT_OK, EXIT_GATE, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush into the closed pipe prints nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (an embedding host): nothing to flush
        pass


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        target, _ = COMMANDS[cmd_name]
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        """An unknown command names the closest one ("did you mean"), as git and pip do."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            import difflib

            close = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (commands: {', '.join(COMMANDS)})"
            raise click.UsageError(f"No such command {name!r}{hint}", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        """A reader that closes stdout early (`ckptinspect audit --format jsonl | head -1`) ends the command
        quietly with exit 141 (128 + SIGPIPE, what the shell reports for `cat` or `git` there), instead of
        click's exit 1, which is the --fail-on gate's code."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _silence_stdout()
            sys.exit(EXIT_BROKEN_PIPE)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ckptinspect")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors (also after the command).")
@click.option("--deadline", type=setting_type("deadline_s"), default=None, metavar="SECONDS", expose_value=False,
              callback=apply_flag("deadline_s"), help=DEADLINE_HELP)
@click.option("--request-timeout", type=setting_type("request_timeout_s"), default=None, metavar="SECONDS",
              expose_value=False, callback=apply_flag("request_timeout_s"), help=REQUEST_TIMEOUT_HELP)
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """ckptinspect: what is in an LLM checkpoint, is its MTP draft layer usable, how to launch it.

    Exit codes (every command): 0 done; 1 a gate tripped (--fail-on, diff's gate); 2 bad input,
    usage, source or network error (one line on stderr; --debug shows the traceback); 130
    interrupted (Ctrl-C; 143 for SIGTERM); 141 stdout closed early (`| head`), nothing printed.

    Text wraps to COLUMNS or the terminal (--wide: full width); verdicts are coloured on a terminal
    unless NO_COLOR is set; progress bars show only on a terminal, never with
    HF_HUB_DISABLE_PROGRESS_BARS=1 or --quiet. Settings: flags, then CKPTINSPECT_* variables, then
    defaults (docs/security.md lists them); a value that cannot be used is an error (exit 2).
    """
    # The settings main() built (or, when the group is invoked without main(), the environment's now);
    # --debug and the network flags update them as click parses them.
    settings = current_settings(ctx)
    if debug:
        ctx.obj["settings"] = replace(settings, debug=True)


# click >= 8.2 raises this for a bare group invocation (8.1 prints the help and exits 0 itself).
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def hoist_debug(args: list[str]) -> tuple[list[str], bool]:
    """``--debug`` anywhere before a ``--`` separator (also after the subcommand) -> the group's option.
    The network options need no hoisting: every command that reads a checkpoint has them
    (cli/options.py ``network_options``)."""
    cut = args.index("--") if "--" in args else len(args)
    head = [arg for arg in args[:cut] if arg != "--debug"]
    debug = len(head) < cut
    return (["--debug"] if debug else []) + head + args[cut:], debug


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C (exit 143): the Hub reader cancels its requests and the HF cache writes
    remove their temporary files, instead of the process vanishing mid-write."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> Any:
    """Run the CLI, turning library errors into one line on stderr and exit code 2. The settings are
    built here, once, before any command runs: a variable that cannot be used is one line and exit 2."""
    from ckptinspect.cli.messages import explain
    from ckptinspect.errors import CkptInspectError

    args, debug = hoist_debug(sys.argv[1:] if argv is None else list(argv))
    _exit_cleanly_on_sigterm()
    try:
        settings = Settings.from_environ()
    except SettingsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    obj: dict[str, Any] = {"settings": settings}
    debug = debug or settings.debug
    try:
        return cli.main(args=args, prog_name="ckptinspect", standalone_mode=False, obj=obj)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except _NO_ARGS_IS_HELP as exc:  # bare `ckptinspect`: the help is the answer
        exc.show()
        sys.exit(2)
    except click.UsageError as exc:  # one line, like every other error
        from ckptinspect.render.terminal import escape_controls

        where = exc.ctx.command_path if exc.ctx is not None else "ckptinspect"
        message = escape_controls(' '.join(exc.format_message().split()))  # the user's argument, quoted
        click.echo(f"error: {where}: {message} (see --help)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        from ckptinspect.render.terminal import escape_controls

        click.echo(f"error: {escape_controls(' '.join(exc.format_message().split()))}", err=True)
        sys.exit(2)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except CkptInspectError as exc:
        if debug:
            raise
        click.echo(f"error: {explain(exc, obj['settings'])}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:  # stdout closed while click itself wrote (help, a usage error's output)
        _silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
