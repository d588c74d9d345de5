"""Conventions every command shares: progress bars, output width, colour, GPU names.

- Progress bars (huggingface_hub's conventions): only when stderr is a terminal, never with
  ``HF_HUB_DISABLE_PROGRESS_BARS`` set to a true value, never with ``--quiet``.
- Width: human text wraps to ``COLUMNS`` or the terminal (80 when neither is known); ``--wide`` gives
  full width. JSON and markdown are never wrapped (a markdown table cannot wrap a cell).
- Colour: verdicts and severities are coloured only when stdout is a terminal and ``NO_COLOR`` is
  unset or empty (https://no-color.org).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import sys
import textwrap
from typing import Any, Callable

import click

from ckptinspect.errors import PlanError

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


def quiet_option(f: Callable) -> Callable:
    return click.option("--quiet", "-q", is_flag=True,
                        help="No progress bar (also off when stderr is not a terminal or "
                             "HF_HUB_DISABLE_PROGRESS_BARS=1).")(f)


def wide_option(f: Callable) -> Callable:
    return click.option("--wide", is_flag=True,
                        help="Full-width text; by default text wraps to COLUMNS or the terminal width.")(f)


# -- GPU names --------------------------------------------------------------------------------------
def _key(text: str) -> str:  # the normalisation find_gpu (plan/gpus.py) applies
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def gpu_names() -> list[tuple[str, tuple[str, ...]]]:
    """(catalog name, aliases) for every GPU of rules/gpus.yaml."""
    from ckptinspect.api import gpus

    return [(g.name, g.aliases) for g in gpus()]


def gpu_catalog_help() -> str:
    """What people type for each GPU (its first alias, else its catalog name), comma-separated."""
    return ", ".join(aliases[0] if aliases else name for name, aliases in gpu_names())


def _one_edit(a: str, b: str) -> bool:
    """``a`` and ``b`` differ by at most one inserted, deleted or replaced character."""
    if abs(len(a) - len(b)) > 1:
        return False
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return a[i + 1:] == b[i + 1:] or a[i:] == b[i + 1:] or a[i + 1:] == b[i:]


def check_gpu(ctx: click.Context | None, param: Any, value: str | None) -> str | None:
    """click callback: an unknown GPU name is a one-line PlanError (exit 2) suggesting the closest names."""
    if value is None:
        return None
    spellings: dict[str, str] = {}  # normalised spelling -> the name to suggest
    for name, aliases in gpu_names():
        for spelling in (name, *aliases):
            spellings[_key(spelling)] = spelling
    from ckptinspect.api import gpu_name_keys

    keys = gpu_name_keys(value)
    if any(k in spellings for k in keys):
        return value
    wanted = keys[-1]
    # Compare with and without dashes, so "rtxpro6000" and "rtx-6000-pro" find "rtx-pro-6000"; but never
    # suggest another card: a suggestion must carry every number the user typed ("h100-nvl" is not an
    # H200, "a6000" not an RTX PRO 6000 unless it says so).
    squashed = {k.replace("-", ""): k for k in spellings}
    close = difflib.get_close_matches(wanted, list(spellings), n=3, cutoff=0.6)
    close += [squashed[k] for k in difflib.get_close_matches(wanted.replace("-", ""), list(squashed), n=3,
                                                             cutoff=0.6)]
    flat = wanted.replace("-", "")

    def same_card(key: str) -> bool:  # the same letters reordered, or one letter off with the same numbers
        other = key.replace("-", "")
        # reordered, or one character doubled or dropped ("h2000" -> h200, "h20o" -> h20); never a
        # changed character ("h300" is neither an H200 nor a B300)
        return sorted(other) == sorted(flat) or (abs(len(other) - len(flat)) == 1 and _one_edit(other, flat))

    close = [k for k in close if same_card(k)]
    suggestion = " or ".join(dict.fromkeys(spellings[k] for k in close[:3]))
    hint = f"did you mean {suggestion}? " if suggestion else ""
    raise PlanError(f"unknown GPU {value!r}; {hint}known GPUs: {gpu_catalog_help()}",
                    hint="`ckptinspect plan --help` lists them")


class Command(click.Command):
    """A click command whose help ends with real examples (and, lazily, any extra text such as the
    GPU catalog, so that importing the command stays cheap)."""

    def __init__(self, *args: Any, examples: tuple[str, ...] = (), more_help: Callable[[], tuple[str, str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.examples = examples
        self.more_help = more_help

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
    return "GPU names (rules/gpus.yaml; case, space and '_' insensitive)", gpu_catalog_help()
