"""The outputs of runs: what a shard reports it uploaded (or skipped) for one of its HQEs."""

from dataclasses import dataclass

from django.db import transaction

from common.blobs import MAX_OUTPUT_FILES, MAX_OUTPUT_PATH_CHARS, MAX_SKIPPED_LISTED, is_digest
from common.errors import FleetshardError, NotFound
from common.models import HostQueueEntry
from common.wire import clean_text, has_unsafe_chars
from master.blobs.models import Artifact, Blob
from master.blobs.store import touch_blobs

MAX_REASON_CHARS = 512


@dataclass(frozen=True)
class OutputFile:
    path: str
    size: int
    digest: str = ""
    skipped: str = ""


def _path(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_OUTPUT_PATH_CHARS or has_unsafe_chars(value):
        raise FleetshardError(f"{where}: path must be 1 to {MAX_OUTPUT_PATH_CHARS} characters, no NUL", field="path")
    parts = value.split("/")
    if value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise FleetshardError(f"{where}: path {value[:80]!r} must be relative, without '.' or '..'", field="path")
    return value


def _size(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
        raise FleetshardError(f"{where}: size must be a whole number of bytes", field="size")
    return value


def parse_outputs(body: object) -> list[OutputFile]:
    """`{"files": [{"path", "size", "digest"}], "skipped": [{"path", "size", "reason"}]}`, checked."""
    if not isinstance(body, dict):
        raise FleetshardError("the body must be an object with files and skipped", field="body")
    files, skipped = body.get("files", []), body.get("skipped", [])
    if not isinstance(files, list) or len(files) > MAX_OUTPUT_FILES:
        raise FleetshardError(f"files: a list of at most {MAX_OUTPUT_FILES} files", field="files")
    if not isinstance(skipped, list) or len(skipped) > MAX_SKIPPED_LISTED + 1:
        raise FleetshardError(f"skipped: a list of at most {MAX_SKIPPED_LISTED + 1} entries", field="skipped")
    out: list[OutputFile] = []
    for n, item in enumerate(files):
        where = f"files[{n}]"
        if not isinstance(item, dict):
            raise FleetshardError(f"{where}: an object with path, size and digest", field="files")
        digest = item.get("digest")
        if not is_digest(digest):
            raise FleetshardError(f"{where}: digest must be 64 lowercase hex digits", field="digest")
        out.append(OutputFile(_path(item.get("path"), where), _size(item.get("size"), where), str(digest)))
    for n, item in enumerate(skipped):
        where = f"skipped[{n}]"
        if not isinstance(item, dict):
            raise FleetshardError(f"{where}: an object with path, size and reason", field="skipped")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason:
            raise FleetshardError(f"{where}: reason must be a non-empty string", field="reason")
        size = item.get("size", 0)
        out.append(
            OutputFile(_path(item.get("path"), where), _size(size, where), "", clean_text(reason)[:MAX_REASON_CHARS])
        )
    paths = [o.path for o in out]
    if len(set(paths)) != len(paths):
        raise FleetshardError("a path is listed twice", field="path")
    return out


@transaction.atomic
def record_artifacts(hqe_id: int, outputs: list[OutputFile]) -> int:
    """Stores what the shard reports for the HQE: the run's whole list, replacing an earlier report.

    Each stored file's blob must be on the master with that size: the shard uploads before it reports.
    """
    # Taken first: a second report of the same run waits for this one (both would insert the same
    # rows: an IntegrityError), and so does a purge deleting the HQE (the rows' foreign key would
    # fail at commit). SQLite has one writer at a time.
    held = HostQueueEntry.objects.select_for_update(no_key=True).filter(id=hqe_id).values_list("id", flat=True)
    if not list(held):
        raise NotFound(f"hqe: unknown HQE {hqe_id}", field="hqe")
    stored = [o for o in outputs if o.digest]
    sizes = dict(Blob.objects.filter(digest__in={o.digest for o in stored}).values_list("digest", "size"))
    for o in stored:
        if sizes.get(o.digest) != o.size:
            raise FleetshardError(
                f"{o.path}: the master has no blob {o.digest} of {o.size} bytes: upload it first", field="digest"
            )
    # The whole list of the run's outputs: it replaces what an earlier report said, so a shard reporting
    # again and again with other paths cannot grow an entry's rows without bound.
    Artifact.objects.filter(hqe_id=hqe_id).delete()
    Artifact.objects.bulk_create(
        Artifact(hqe_id=hqe_id, path=o.path, size=o.size, digest=o.digest, skipped=o.skipped) for o in outputs
    )
    touch_blobs(sorted(sizes))
    return len(outputs)
