"""Terminal conventions shared by the human renderers: output width, table fitting, verdict colour.

The CLI decides *whether* to limit the width or colour (cli/options.py: COLUMNS, a TTY, NO_COLOR,
--wide); these functions only apply the decision, so a renderer called from Python with the defaults
gives full-width, uncoloured text.
"""

from __future__ import annotations

import textwrap
from typing import Any, Sequence

import click
from tabulate import tabulate

from ckptinspect.escape import escape_controls  # noqa: F401  (the CLI's usage-error lines use it)

MIN_COLUMN = 8  # a column is never wrapped narrower than this (or its natural width, if smaller)
COLUMN_GAP = 2  # tabulate's "simple" format separates columns by two spaces
MAX_UNBROKEN_WORD = 24  # longer words (module paths) may be broken to fit
HEADER_PADDING = 2  # and makes a column at least its header + 2 wide (tabulate.MIN_PADDING)
VERDICT_COLOURS = {"ready": "green", "degraded": "yellow", "unusable": "red", "absent": "bright_black"}
SEVERITY_COLOURS = {"error": "red", "warning": "yellow"}


def verdict(text: str, colour: bool) -> str:
    """The verdict in upper case, coloured by how bad it is when ``colour`` is on."""
    label = text.upper()
    return click.style(label, fg=VERDICT_COLOURS.get(text), bold=text != "absent") if colour else label


def severity(text: str, colour: bool) -> str:
    fg = SEVERITY_COLOURS.get(text)
    return click.style(text, fg=fg) if colour and fg else text


def _cell_width(cell: Any) -> int:
    return max((len(click.unstyle(line)) for line in str(cell).splitlines()), default=0)


def _longest_word(cell: Any) -> int:
    return max((len(w) for w in click.unstyle(str(cell)).split()), default=0)


def column_limits(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None) -> list[int | None] | None:
    """Per-column wrap widths so that a "simple" table fits in ``width`` characters (None: it cannot).

    The column with the most room above its floor is narrowed one character at a time, so short
    columns (codes, numbers) stay whole and the long prose column wraps first. A column's floor is
    its longest word (capped at MAX_UNBROKEN_WORD), so words are broken only when they are very long.
    """
    ncols = max([len(headers)] + [len(r) for r in rows]) if (rows or headers) else 0
    natural, floor = [0] * ncols, [MIN_COLUMN] * ncols
    for row in rows:
        for i, cell in enumerate(row):
            natural[i] = max(natural[i], _cell_width(cell))
            floor[i] = max(floor[i], min(MAX_UNBROKEN_WORD, _longest_word(cell)))
    for i, header in enumerate(headers):  # tabulate pads a header by HEADER_PADDING
        natural[i] = max(natural[i], _cell_width(header) + HEADER_PADDING)
        floor[i] = max(floor[i], _longest_word(header) + HEADER_PADDING)
    floor = [min(f, n) for f, n in zip(floor, natural)]
    gaps = COLUMN_GAP * (ncols - 1)
    if width is None or sum(natural) + gaps <= width:
        return [None] * ncols
    if sum(floor) + gaps > width:
        return None
    limits = list(natural)
    excess = sum(limits) + gaps - width
    while excess > 0:
        i = max(range(ncols), key=lambda j: limits[j] - floor[j])
        limits[i] -= 1
        excess -= 1
    return [None if lim == nat else lim for lim, nat in zip(limits, natural)]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None) -> str:
    """A "simple" tabulate table, wrapped to ``width`` (None: full width).

    A table too wide even with every column at its floor is printed as one block per row instead
    (the first cell as the block's title, then "header  value" lines).
    """
    shown = list(headers) if any(headers) else ()
    limits = column_limits(shown, rows, width)
    if limits is None:
        assert width is not None
        return _blocks(shown, rows, width)
    kwargs: dict[str, Any] = {}
    if any(limit is not None for limit in limits):
        kwargs["maxcolwidths"] = limits
        if shown:
            kwargs["maxheadercolwidths"] = [None if lim is None else max(1, lim - HEADER_PADDING)
                                            for lim in limits]
    return tabulate(rows, headers=shown, tablefmt="simple", disable_numparse=True, **kwargs)


def _blocks(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int) -> str:
    names = list(headers) or [""] * max(len(r) for r in rows)
    label = max(len(n) for n in names[1:]) if len(names) > 1 else 0
    out: list[str] = []
    for row in rows:
        out.append(str(row[0]))
        for name, cell in zip(names[1:], row[1:]):
            lead = f"  {name:<{label}}  "
            lines = textwrap.wrap(str(cell), width=max(MIN_COLUMN, width - len(lead)), break_on_hyphens=False)
            for k, line in enumerate(lines or ["-"]):
                out.append((lead if k == 0 else " " * len(lead)) + line)
    return "\n".join(out)


def wrap_text(text: str, width: int | None) -> str:
    """Wrap prose lines longer than ``width``, keeping their indent (+2 on continuation lines).

    Lines of a shell command (ending in a backslash continuation, or continuing one) are left whole:
    a wrapped command would no longer paste into a shell.
    """
    if width is None:
        return text
    out: list[str] = []
    in_command = False
    for line in text.split("\n"):
        command_line = in_command or line.endswith(" \\")
        in_command = line.endswith(" \\")
        if command_line or len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line.strip(), width=width, initial_indent=indent,
                                 subsequent_indent=indent + "  ", break_on_hyphens=False))
    return "\n".join(out)
