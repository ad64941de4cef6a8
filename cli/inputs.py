"""Lists given as "a,b" options, repeated options, arguments and -M/-B files (one or more names a line)."""

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from cli.client import CliError
from common.errors import FleetshardError


def split(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def read_list(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return [item for line in lines for item in line.replace(",", " ").split()]


def need(items: list[str], what: str) -> list[str]:
    if not items:
        raise click.UsageError(f"give at least one {what}")
    return list(dict.fromkeys(items))


def key_values(pairs: Iterable[str], option: str) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint=option)
        result[key] = value
    return result


HOSTS_FILE = click.option("-M", "--mlist", "host_file", metavar="FILE", help="Read hostnames from FILE too.")
LABELS_FILE = click.option("-B", "--blist", "label_file", metavar="FILE", help="Read labels from FILE too.")


class Id(click.ParamType[int]):
    """A positive whole number naming an object (`job wait abc` is bad usage, said in words)."""

    name = "id"

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        text = str(value).strip()
        if text.isascii() and text.isdigit() and 0 < len(text) < 19 and int(text) >= 1:
            return int(text)
        a = "an" if self.kind[:1] in "aeiou" else "a"
        self.fail(f"{value!r} is not {a} {self.kind} id: {a} {self.kind} id is a whole number from 1", param, ctx)


def checked(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback refusing, as bad usage, what `parse` (the master's own syntax rule, from
    common/syntax.py) refuses; the value is sent as given."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        for item in value if isinstance(value, tuple) else () if value is None else (value,):
            try:
                parse(item)
            except FleetshardError as exc:
                raise click.BadParameter(exc.message, ctx, param) from None
        return value

    return callback


class Number(click.FloatRange):
    """A FloatRange that also refuses nan and inf: its bounds let nan through (no comparison holds),
    and `--timeout nan` waited for ever, `--interval inf` was a traceback from time.sleep."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number
