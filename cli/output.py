"""What the command line prints: plain tables for people, JSON (`--json`) for scripts."""

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import click

Column = tuple[str, str | Callable[[dict[str, Any]], Any]]

# What a terminal acts on rather than shows: C0 controls but tab and newline, DEL, C1 controls (0x9b
# is a CSI on its own) and the bidirectional overrides that make text read other than it is.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` for a person's terminal: job output, job names and commands are anyone's, and an escape
    sequence in them (clear the screen, retitle the window, OSC 52 into the clipboard) must show as
    text, never act. `--json` needs none of this: json.dumps escapes them itself."""
    return _TERMINAL_CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


# In a table cell, also the tab and newline that `printable` keeps: a newline in a job's name would
# print a row of the name's choosing.
_CELL_BREAKS = re.compile("[\t\n]")


def one_line(text: str) -> str:
    """`text` for one cell of a table or one `Label:  value` line: printable, and on one line."""
    return printable(_CELL_BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text))


# An API time (ISO 8601, as JSON keeps it): the terminal shows every one of them the same way.
_API_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-]\d\d:\d\d)")


class Clock:
    """Where the terminal's times are shown: local time, or UTC with --utc (FLEETSHARD_UTC=1)."""

    utc = False


def shown_time(value: str) -> str:
    """`2026-11-25T16:27:27.123456Z` as `2026-11-25 16:27:27`, in local time or UTC (--utc): one format
    on every table and stat, to the second (the API's microseconds only widen tables)."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC if Clock.utc else None)
    except (OverflowError, OSError):
        return value
    # Not strftime: its %Y is `1`, not `0001`, for the years before 1000 on glibc.
    return moment.replace(tzinfo=None).isoformat(" ", "seconds")


def when(key: str) -> Callable[[dict[str, Any]], str | None]:
    """A timestamp column: the terminal's one time format."""

    def get(row: dict[str, Any]) -> str | None:
        value = row.get(key)
        return shown_time(value) if isinstance(value, str) else value

    return get


def cell(value: Any) -> str:
    return one_line(_cell(value))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, str) and _API_TIME.fullmatch(value):
        return shown_time(value)
    return str(value) if value != "" else "-"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Left-aligned columns under a header; the last column is not padded so long label lists wrap naturally."""
    grid = [[header for header, _ in columns]]
    for row in rows:
        grid.append([cell(get(row) if callable(get) else row.get(get)) for _, get in columns])
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(widths[i]) if i < len(columns) - 1 else text for i, text in enumerate(line)).rstrip()
        for line in grid
    )


def fields(obj: dict[str, Any], names: Sequence[tuple[str, str]]) -> str:
    """`Label:  value` lines, for one object."""
    width = max(len(title) for title, _ in names) + 1
    return "\n".join(f"{(title + ':').ljust(width)}  {cell(obj.get(key))}" for title, key in names)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def names(objs: Sequence[dict[str, Any]], key: str) -> str:
    return ", ".join(str(o[key]) for o in objs)


def plural(kind: str, items: Sequence[Any]) -> str:
    """`label a` or `labels a, b`."""
    return f"{kind}{'s' if len(items) != 1 else ''} {', '.join(str(i) for i in items)}"


def moves(moved: Sequence[dict[str, Any]]) -> str:
    """The API's hosts_moved as a sentence: `host dut3 left shard lab1; hosts a1, a2 joined shard lab2`."""
    groups: dict[tuple[str, str], list[str]] = {}
    for move in moved:
        groups.setdefault((move.get("from_shard") or "", move.get("to_shard") or ""), []).append(move["hostname"])
    parts = []
    for (before, after), hostnames in sorted(groups.items()):
        who = plural("host", sorted(hostnames))
        if not after:
            parts.append(f"{who} left shard {before}")
        elif not before:
            parts.append(f"{who} joined shard {after}")
        else:
            parts.append(f"{who} moved from shard {before} to shard {after}")
    return "; ".join(parts)


def with_moves(text: str, moved: Sequence[dict[str, Any]]) -> str:
    """`text`, then which hosts changed shard, if any did."""
    sentence = moves(moved)
    return f"{text}; {sentence}" if sentence else text
