"""Blob bytes in STORAGES["blobs"]: written from a stream while its SHA-256 and size are checked,
stored only when both match (a mismatch, an oversize body or a client that hangs up leaves nothing),
and read back a chunk at a time. Never a whole blob in memory.

A FileSystemStorage gets the checked temporary file renamed into place (no second copy); any other
backend is handed the temporary file through `Storage.save`.
"""

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Protocol

from django.conf import settings
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.db import transaction
from django.utils import timezone

from common.blobs import CHUNK, blob_name
from common.models import Job
from master.blobs.models import Artifact, Blob


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class BlobRejected(Exception):
    """The body is not the blob its name says; nothing was stored. `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def blob_storage() -> Storage:
    return storages["blobs"]


def max_input_bytes() -> int:
    return int(settings.FLEETSHARD_MAX_INPUT_BYTES)


def _staging_dir(storage: Storage) -> str | None:
    """Where a FileSystemStorage's uploads are written before their rename: the same file system."""
    if isinstance(storage, FileSystemStorage):
        path = Path(storage.location) / ".incoming"
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    return None


def receive_blob(digest: str, stream: Readable, length: int) -> bool:
    """Stores `length` bytes read from `stream` as blob `digest`; True when it was new.

    Raises BlobRejected (nothing stored) when the body is shorter than `length` (the client hung up
    or its Content-Length lied), or its SHA-256 is not `digest`.
    """
    storage = blob_storage()
    # A row whose bytes are gone (a storage restored without them, a purge racing an upload) is
    # stored again rather than answered "had it" forever.
    if Blob.objects.filter(digest=digest).exists() and has_bytes(digest):
        _drain(stream, length)
        return False
    try:
        tmp_name = _write_checked(storage, digest, stream, length)
    except OSError as exc:
        # The master's own disk (full, over a quota): the client may try again later; nothing is kept.
        raise BlobRejected(507, f"the master cannot store the blob now: {exc.strerror or exc}") from None
    with contextlib.suppress(OSError):
        os.unlink(tmp_name)
    _record(digest, length)
    return True


def _write_checked(storage: Storage, digest: str, stream: Readable, length: int) -> str:
    """Writes the body to a temporary file and puts it in place once checked; the temporary name."""
    hasher = hashlib.sha256()
    with tempfile.NamedTemporaryFile(prefix=f"{digest[:16]}-", dir=_staging_dir(storage), delete=False) as tmp:
        try:
            left = length
            while left:
                chunk = stream.read(min(CHUNK, left))
                if not chunk:
                    raise BlobRejected(400, f"the body ended after {length - left} of the {length} bytes announced")
                hasher.update(chunk)
                tmp.write(chunk)
                left -= len(chunk)
            if hasher.hexdigest() != digest:
                raise BlobRejected(
                    400, f"digest mismatch: the body's SHA-256 is {hasher.hexdigest()}, not the {digest} named"
                )
            tmp.flush()
            os.fsync(tmp.fileno())
            _put(storage, digest, tmp.name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp.name)
            raise
    return tmp.name


def has_bytes(digest: str) -> bool:
    try:
        return bool(blob_storage().exists(blob_name(digest)))
    except OSError:
        return False


def _put(storage: Storage, digest: str, tmp_name: str) -> None:
    name = blob_name(digest)
    if isinstance(storage, FileSystemStorage):
        target = Path(storage.path(name))
        target.parent.mkdir(parents=True, exist_ok=True)
        if storage.file_permissions_mode is not None:
            os.chmod(tmp_name, storage.file_permissions_mode)
        os.replace(tmp_name, target)
        return
    if storage.exists(name):
        storage.delete(name)
    with open(tmp_name, "rb") as handle:
        storage.save(name, File(handle))


@transaction.atomic
def _record(digest: str, size: int) -> bool:
    _, created = Blob.objects.get_or_create(digest=digest, defaults={"size": size})
    return created


def _drain(stream: Readable, length: int) -> None:
    """Reads what the client sends of a blob the master has, so the connection stays usable."""
    left = length
    while left > 0:
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)


def open_blob(digest: str) -> IO[bytes]:
    handle: IO[bytes] = blob_storage().open(blob_name(digest), "rb")
    return handle


def iter_blob(handle: IO[bytes], start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes of an opened blob from `start` up to `end` (exclusive), a chunk at a time; closes it.

    The caller opens it (`open_blob`) before answering, so bytes missing from storage are a clear
    error rather than a response cut off after its headers.
    """
    with handle:
        if start:
            handle.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            chunk = handle.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk


def touch_blobs(digests: list[str]) -> None:
    """Referred to again: purge counts the retention from now."""
    if digests:
        Blob.objects.filter(digest__in=digests).update(last_used=timezone.now())


def referenced_digests() -> set[str]:
    """Every blob a job's inputs or a run's outputs name."""
    used = {d for d in Artifact.objects.exclude(digest="").values_list("digest", flat=True).distinct()}
    for inputs in Job.objects.exclude(inputs=[]).values_list("inputs", flat=True).iterator(chunk_size=2000):
        for item in inputs if isinstance(inputs, list) else []:
            if isinstance(item, dict) and isinstance(item.get("digest"), str):
                used.add(item["digest"])
    return used


def purge_blobs(retention_days: float, *, dry_run: bool = False) -> int:
    """Removes blobs nothing refers to and nobody used for `retention_days`; returns how many."""
    cutoff = timezone.now() - timedelta(days=retention_days)
    used = referenced_digests()
    stale = [d for d in Blob.objects.filter(last_used__lt=cutoff).values_list("digest", flat=True) if d not in used]
    if dry_run:
        return len(stale)
    storage = blob_storage()
    removed = 0
    for digest in stale:
        # Used since it was read (a job created meanwhile bumps last_used): kept.
        if Blob.objects.filter(digest=digest, last_used__lt=cutoff).delete()[0]:
            removed += 1
            with contextlib.suppress(OSError):
                storage.delete(blob_name(digest))
    _remove_stale_staging(storage, cutoff.timestamp())
    return removed


def _remove_stale_staging(storage: Storage, cutoff: float) -> None:
    """Uploads a killed master left half-written: never in place, so only their space is lost."""
    staging = _staging_dir(storage)
    if staging is None:
        return
    for entry in os.scandir(staging):
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
