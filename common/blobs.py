"""Blobs: content-addressed files (a job's inputs, a run's outputs), named by their SHA-256 in hex.

Both roles need the same names and checks: the master stores blobs at `ab/cd/DIGEST`, a shard's
cache keeps them by digest, and a job's `inputs` list travels between them (docs/protocol.md).
"""

import hashlib
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
INPUT_KINDS = ("file", "tar")
# An input's NAME: one path component a job opens under $FLEETSHARD_INPUT_DIR.
INPUT_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}")
MAX_INPUTS_PER_JOB = 32
# A run's outputs: at most this many files an HQE (over it: listed as skipped).
MAX_OUTPUT_FILES = 1000
# Skipped outputs listed by name; past this many only their count is kept.
MAX_SKIPPED_LISTED = 1000
MAX_OUTPUT_PATH_CHARS = 1024
# A directory input's entries: the CLI refuses more, a shard unpacks no more (tarfile keeps each in memory).
MAX_TAR_MEMBERS = 100_000
CHUNK = 1 << 20


def is_digest(text: object) -> bool:
    return isinstance(text, str) and DIGEST_RE.fullmatch(text) is not None


def blob_name(digest: str) -> str:
    """Where a blob lives in storage: `ab/cd/DIGEST` keeps directories small."""
    return f"{digest[:2]}/{digest[2:4]}/{digest}"


def hash_stream(stream: BinaryIO) -> tuple[str, int]:
    """(hex SHA-256, size) of what `stream` holds from where it stands, read a chunk at a time."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


class BadInput(ValueError):
    """An `inputs` item that is not one: the message names what is wrong."""


@dataclass(frozen=True)
class InputRef:
    """One input of a job: the blob `digest` (`size` bytes) seen by its runs as `$FLEETSHARD_INPUT_DIR/NAME`."""

    name: str
    digest: str
    size: int
    kind: str

    @classmethod
    def parse(cls, item: object, max_bytes: int | None = None) -> "InputRef":
        if not isinstance(item, dict):
            raise BadInput(f"an input is an object with name, digest, size and kind, not {type(item).__name__}")
        name, digest, size, kind = (item.get(k) for k in ("name", "digest", "size", "kind"))
        if not isinstance(name, str) or not INPUT_NAME_RE.fullmatch(name) or name in (".", ".."):
            raise BadInput(
                f"input name {str(name)[:80]!r}: use 1 to 128 letters, digits, '.', '_', '+' or '-', "
                "not starting with '.' or '-'"
            )
        if not is_digest(digest):
            raise BadInput(f"input {name}: digest must be 64 lowercase hex digits (SHA-256)")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > 2**62:
            raise BadInput(f"input {name}: size must be a whole number of bytes")
        if max_bytes is not None and size > max_bytes:
            raise BadInput(f"input {name}: {size} bytes is over FLEETSHARD_MAX_INPUT_BYTES ({max_bytes})")
        if kind not in INPUT_KINDS:
            raise BadInput(f"input {name}: kind must be one of {', '.join(INPUT_KINDS)}, not {str(kind)[:40]!r}")
        return cls(name, str(digest), int(size), str(kind))

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "size": self.size, "kind": self.kind}


def parse_inputs(items: object, max_bytes: int | None = None) -> list[InputRef]:
    """A job's inputs, each checked, names unique; BadInput names the first wrong one."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise BadInput("inputs must be a list")
    if len(items) > MAX_INPUTS_PER_JOB:
        raise BadInput(f"a job has at most {MAX_INPUTS_PER_JOB} inputs, not {len(items)}")
    refs = [InputRef.parse(item, max_bytes) for item in items]
    seen: set[str] = set()
    for ref in refs:
        if ref.name in seen:
            raise BadInput(f"input name {ref.name} is given twice: names are unique in a job")
        seen.add(ref.name)
    return refs
