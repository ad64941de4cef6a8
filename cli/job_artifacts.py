"""`fleetshard job artifacts ID [--hqe N] [--get PATH [-o FILE]]`: the files a job's runs left in
$FLEETSHARD_OUTPUT_DIR, listed (path, size, digest, entry), or one downloaded with its digest checked."""

import hashlib
import sys
from typing import Any

import click

from cli.action import Run, action
from cli.blobs import download_blob, output_target
from cli.client import CliError
from cli.inputs import Id

COLUMNS: list[tuple[str, str]] = [("Entry", "hqe"), ("Path", "path"), ("Size", "size"), ("Digest", "digest")]


@click.command("artifacts")
@click.argument("job_id", metavar="ID", type=Id("job"))
@click.option("--hqe", type=Id("entry"), metavar="N", help="Only this entry's outputs.")
@click.option("--get", "get", metavar="PATH", help="Download this output (its digest checked).")
@click.option(
    "-o",
    "--output",
    "output",
    metavar="FILE",
    help="Where --get writes: a file, a directory, or - for stdout (default: the base name here).",
)
@action
def job_artifacts(run: Run, job_id: int, hqe: int | None, get: str | None, output: str | None) -> None:
    """List a job's outputs, or download one with --get."""
    rows: list[dict[str, Any]] = run.api.get(f"/jobs/{job_id}/artifacts", hqe=hqe)
    if get is None:
        if output:
            raise click.UsageError("-o goes with --get PATH")
        shown = [{**r, "digest": r["digest"] or f"skipped: {r['skipped']}"} for r in rows]
        run.rows(rows if run.as_json else shown, COLUMNS, "outputs")
        return
    matches = [r for r in rows if r["path"] == get]
    stored = [r for r in matches if r["digest"]]
    if not matches:
        raise CliError(f"job {job_id} has no output {get!r}{f' in entry {hqe}' if hqe else ''}")
    if not stored:
        raise CliError(f"{get}: not stored: {matches[0]['skipped']}")
    if len(stored) > 1:
        entries = ", ".join(str(r["hqe"]) for r in stored)
        raise CliError(f"{get}: written by entries {entries}: choose one with --hqe")
    row = stored[0]
    if output == "-":
        _to_stdout(run, row["digest"])
        return
    target = output_target(output, get)
    size = download_blob(run.api, row["digest"], target)
    run.done({**row, "file": str(target)}, f"{get} (entry {row['hqe']}): {size} bytes to {target}, sha256 checked")


def _to_stdout(run: Run, digest: str) -> None:
    hasher = hashlib.sha256()

    class _Out:
        def write(self, data: bytes) -> None:
            hasher.update(data)
            sys.stdout.buffer.write(data)

    run.api.download(f"/blobs/{digest}", _Out(), {})
    sys.stdout.buffer.flush()
    if hasher.hexdigest() != digest:
        raise CliError(f"the download's SHA-256 is {hasher.hexdigest()}, not {digest}: do not trust what was written")
