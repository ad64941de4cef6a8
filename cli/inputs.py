"""Lists given as "a,b" options, repeated options, arguments and -M/-B files (one or more names a line)."""

from collections.abc import Iterable
from pathlib import Path

import click

from cli.client import CliError


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
