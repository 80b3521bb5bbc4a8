"""Reading a run's files so that nothing is silently wrong: a damaged file is an error naming the
file (and the line), never a bare JSON traceback; the one damage that is expected, a last line of
metrics.jsonl cut short by a kill or a full disk, is skipped with a warning on stderr.

Policy of `read_metrics` (metrics.jsonl, one JSON object per log step, appended):
1. A last line that is not a JSON object is a torn write: skipped, with a warning naming the file
   and the line.
2. Any other line that is not a JSON object with an int "step" and a number "loss" is corruption:
   an error naming the file and the line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnzoo.core.checks import fail


def warn(message: str) -> None:
    """One line on stderr: what the library did that the user should know about."""
    print(f"attnzoo: warning: {message}", file=sys.stderr, flush=True)


def read_json(path: Path, what: str = "a JSON file"):
    """The JSON in `path`; an unreadable or malformed file is an error naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        fail("attnzoo", str(path), what, "no such file", FileNotFoundError)
    except (UnicodeDecodeError, IsADirectoryError) as err:
        fail("attnzoo", str(path), what, f"unreadable text ({err})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        fail("attnzoo", str(path), what, f"malformed JSON ({err})")


def _row(line: str, value: str | None = "loss") -> dict | None:
    """A metrics row (with a number `value` unless None), or None when `line` is not one."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict):
        return None
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    if value is None:
        return row
    number = row.get(value)
    if isinstance(number, bool) or not isinstance(number, int | float):
        return None
    return row


def read_metrics(path: Path, value: str | None = "loss") -> list[dict]:
    """The rows of a metrics.jsonl (module docstring: a torn last line is skipped with a
    warning, a bad line before it is an error naming the file and the line). `value`: the
    number every row holds beside "step" (None: none, e.g. the loop's scalars.jsonl)."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except IsADirectoryError:
        fail("attnzoo", str(path), "a metrics file", "a directory")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last complete line
    rows = []
    for number, line in enumerate(lines, start=1):
        row = _row(line, value)
        if row is not None:
            rows.append(row)
        elif number == len(lines):
            warn(f"{path}: skipped the torn last line {number} ({_preview(line)})")
        else:
            fail(
                "attnzoo",
                str(path),
                'one JSON object per line with an int "step"'
                + (f' and a number "{value}"' if value else ""),
                f"line {number}: {_preview(line)}",
            )
    return rows


def _preview(line: str, width: int = 40) -> str:
    text = line if len(line) <= width else line[:width] + "..."
    return repr(text)


def note(message: str) -> None:
    """One line on stderr: what a run did to its files that the user asked for (e.g. cleared
    a run directory, recorded a changed key)."""
    print(f"attnzoo: {message}", file=sys.stderr, flush=True)
