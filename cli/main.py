"""`fleetshard TOPIC ACTION`: the master's REST API from a shell, with the grammar of Autotest's `atest`.

Exit statuses and the one-line errors are cli/errors.py's. Each topic's actions live in their own module
(cli/labels.py, cli/hosts.py, ...); this one joins them.
"""

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from cli import audit, errors, hosts, jobs, labels, notify, results, shards, timeline, tokens
from cli.action import JSON_HELP, UTC_HELP, check_server, topic_json
from cli.client import DEFAULT_SERVER
from common.constants import CLIENT_VERSION


class FleetshardGroup(click.Group):
    """A click group whose failures all speak as cli/errors.py says, never click's Usage/Try/Aborted!."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise errors.Interrupted() from None
        except BrokenPipeError:
            # Before click's own handling of EPIPE, which exits 1 as if the action had failed.
            errors.reader_gone()

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> NoReturn:
        if sys.stdout is None:
            # `>&-`: what the action prints (a token shown only once) would go nowhere, so it is not done.
            errors.finish(click.UsageError("standard output is closed: nothing could be shown"))
        robust_streams()
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except (click.ClickException, click.Abort) as exc:
            errors.finish(exc)
        except KeyboardInterrupt:
            errors.finish(errors.Interrupted())
        except BrokenPipeError:
            errors.reader_gone()
        raise SystemExit(code if isinstance(code, int) else 0)


def robust_streams() -> None:
    """A terminal or pipe that is not UTF-8 (LANG=C, a latin-1 log file) still gets every line: a
    character it cannot hold shows as its escape (`\\xe9`) instead of ending the command half way."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


@click.group(cls=FleetshardGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--server",
    envvar="FLEETSHARD_SERVER",
    default=DEFAULT_SERVER,
    show_default=True,
    metavar="URL",
    callback=check_server,
    help="The master's URL [env FLEETSHARD_SERVER].",
)
@click.option("--token", envvar="FLEETSHARD_TOKEN", metavar="TOKEN", help="Your API token [env FLEETSHARD_TOKEN].")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.option("--utc", is_flag=True, envvar="FLEETSHARD_UTC", help=UTC_HELP)
@click.version_option(CLIENT_VERSION, prog_name="fleetshard")
def main(server: str, token: str | None, as_json: bool, utc: bool) -> None:
    """Drive a fleetshard master: labels, hosts, shards, jobs, tokens, the audit trail, benchmark results
    and timelines.

    Exit status: 0 done, 1 failed, 2 bad usage, 124 `job wait --timeout` ran out, 130 interrupted.
    """


for topic in (
    labels.label,
    hosts.host,
    shards.shard,
    jobs.job,
    tokens.token,
    audit.audit,
    results.results,
    timeline.timeline,
    notify.notify,
):
    main.add_command(topic_json(topic))
main.add_command(tokens.whoami)


if __name__ == "__main__":
    main(prog_name="fleetshard")
