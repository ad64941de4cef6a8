"""The frame of every action: its --json, --server and --token options and what it gets to run with."""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from cli.client import DEFAULT_SERVER, Api
from cli.output import emit_json, printable


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


def action(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --json, --server and --token to an action; the action's own --server/--token beat the global ones."""

    @functools.wraps(fn)
    def wrapper(*args: Any, as_json: bool, server: str | None, token: str | None, **kwargs: Any) -> Any:
        root = click.get_current_context().find_root().params
        api = Api(server or root.get("server") or DEFAULT_SERVER, token or root.get("token"))
        return fn(Run(api, as_json), *args, **kwargs)

    wrapper = click.option("--token", metavar="TOKEN", help="API token (overrides FLEETSHARD_TOKEN).")(wrapper)
    wrapper = click.option("--server", metavar="URL", help="Master URL (overrides FLEETSHARD_SERVER).")(wrapper)
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(wrapper)
