"""How carbonflow's commands write to a terminal: one width rule for every rich Console they print with.

Output is at most :data:`MAX_WIDTH` columns: the terminal's width when it is narrower, and exactly
:data:`MAX_WIDTH` when the output is piped (a log file, CI), where rich alone would squeeze to 80 columns
(``$COLUMNS`` still narrows it). Tables are built to fit that width without breaking words; only long ids
(configuration keys, paths) may fold.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from rich.console import Console

MAX_WIDTH = 100
"""Columns carbonflow's command output fits in."""


def output_width() -> int:
    """``min(terminal width, 100)``; 100 when piped, unless ``$COLUMNS`` asks for less."""
    probe = Console()
    if probe.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return max(40, min(probe.width, MAX_WIDTH))
    return MAX_WIDTH


def cli_console(**kwargs: Any) -> Console:
    """A rich Console for command output, :func:`output_width` wide."""
    return Console(width=output_width(), **kwargs)


def shorten(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters, cut at a word with ``…``."""
    return textwrap.shorten(" ".join(text.split()), width=width, placeholder=" …")


def print_wrapped(console: Console, text: str, *, first: str = "", rest: str = "", style: str | None = None) -> None:
    """``text`` wrapped to the console's width with a hanging indent (plain text: no markup, no trailing blanks);
    a word longer than a line (a path, a URI) goes whole on a line of its own, as :func:`print_path` prints it."""
    lines = textwrap.wrap(text, width=console.width, initial_indent=first, subsequent_indent=rest,
                          break_on_hyphens=False, break_long_words=False) or [first]  # fmt: skip
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True, style=style)


def print_path(console: Console, label: str, path: object, *, indent: str = "") -> None:
    """``label path`` on one line when it fits, else the label and then the whole path on a line of its own: a
    path is never cut or wrapped by carbonflow (a terminal may soft-wrap it; copying it still gives one line)."""
    text = f"{indent}{label} {path}"
    if len(text) <= console.width:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    console.print(f"{indent}{label}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"{indent}  {path}", markup=False, highlight=False, soft_wrap=True)


def short_time(iso: str | None, suffix: str = "") -> str:
    """An ISO time as ``03-15 02:00`` plus ``suffix`` (no year; rounded to the nearest minute, as the plan's reason
    and the report show it); ``'–'`` when missing, the text itself when it is not a time."""
    from datetime import datetime

    from carbonflow.units import nearest_minute

    if not iso:
        return "–"
    try:
        return nearest_minute(datetime.fromisoformat(iso)).strftime("%m-%d %H:%M") + suffix
    except ValueError:
        return iso
