"""`fleetshard results ...`: benchmark results on the master."""

import click

from cli.results_upload import upload


@click.group()
def results() -> None:
    """Benchmark results: upload result files, query runs and timings, watch regressions."""


results.add_command(upload)
