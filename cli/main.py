"""`fleetshard TOPIC ACTION`: the master's REST API from a shell, with the grammar of Autotest's `atest`.

Exit status: 0 on success, 1 on a failure (one line on stderr), 2 on bad usage (click's own).
Each topic's actions live in their own module (cli/labels.py, cli/hosts.py, ...); this one joins them.
"""

import click

from cli import audit, hosts, jobs, labels, results, shards, timeline
from cli.client import DEFAULT_SERVER
from common.constants import CLIENT_VERSION


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--server",
    envvar="FLEETSHARD_SERVER",
    default=DEFAULT_SERVER,
    show_default=True,
    metavar="URL",
    help="The master's URL [env FLEETSHARD_SERVER].",
)
@click.option("--token", envvar="FLEETSHARD_TOKEN", metavar="TOKEN", help="Your API token [env FLEETSHARD_TOKEN].")
@click.version_option(CLIENT_VERSION, prog_name="fleetshard")
def main(server: str, token: str | None) -> None:
    """Drive a fleetshard master: labels, hosts, shards, jobs, the audit trail, benchmark results and timelines."""


for topic in (labels.label, hosts.host, shards.shard, jobs.job, audit.audit, results.results, timeline.timeline):
    main.add_command(topic)


if __name__ == "__main__":
    main(prog_name="fleetshard")
