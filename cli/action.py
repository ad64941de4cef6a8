"""The frame of every action: its --json, --server and --token options and what it gets to run with."""

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import click

from cli.client import DEFAULT_SERVER, Api
from cli.output import Clock, Column, emit_json, printable, table

JSON_HELP = "Print JSON instead of a table (before or after the action)."
UTC_HELP = "Show times in UTC rather than local time [env FLEETSHARD_UTC]; JSON is always ISO 8601 UTC."


def check_server(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A master URL is http:// or https:// and a host: anything else is bad usage, found before sending."""
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  # raises on a port that is not a number
        # An empty or over-long name part (`a..b`, 64+ characters) fails only when connecting, deep in urllib3.
        (parts.hostname or "").encode("idna")
    except ValueError:  # UnicodeError is one
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        example = f"http://{value}" if parts is not None and "://" not in value else "http://HOST:PORT"
        raise click.BadParameter(f"{value!r} is not a master URL: use {example} (or https://)", ctx, param)
    return value


@dataclass
class Run:
    """What every action gets: the API client and whether to print JSON."""

    api: Api
    as_json: bool

    def done(self, data: Any, text: str | Callable[[], str]) -> None:
        if self.as_json:
            emit_json(data)
        else:
            click.echo(printable(text() if callable(text) else text))

    def rows(self, rows: Sequence[dict[str, Any]], columns: Sequence[Column], what: str) -> None:
        """A list: a table, or `No WHAT.` when there is nothing to show (`[]` in JSON)."""
        self.done(rows, lambda: table(rows, columns) if rows else f"No {what}.")


_JSON_BEFORE = "fleetshard.json"


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_JSON_BEFORE] = True


def topic_json(group: click.Group) -> click.Group:
    """Lets `fleetshard TOPIC --json ACTION` mean what --json before or after the action means."""
    group.params.append(
        click.Option(["--json"], is_flag=True, expose_value=False, callback=_remember_json, help=JSON_HELP)
    )
    return group


def action(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --json, --server and --token to an action; the action's own --server/--token beat the global ones."""

    @functools.wraps(fn)
    def wrapper(*args: Any, as_json: bool, server: str | None, token: str | None, utc: bool, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        root = ctx.find_root().params
        Clock.utc = utc or bool(root.get("utc"))
        api = Api(server or root.get("server") or DEFAULT_SERVER, token or root.get("token"))
        json_before = bool(root.get("as_json")) or bool(ctx.meta.get(_JSON_BEFORE))
        return fn(Run(api, as_json or json_before), *args, **kwargs)

    wrapper = click.option("--utc", is_flag=True, help=UTC_HELP)(wrapper)
    wrapper = click.option("--token", metavar="TOKEN", help="API token (overrides FLEETSHARD_TOKEN).")(wrapper)
    wrapper = click.option(
        "--server", metavar="URL", callback=check_server, help="Master URL (overrides FLEETSHARD_SERVER)."
    )(wrapper)
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(wrapper)
