"""A run's outputs go to the master once it ended: each regular file under the run's `outputs/`
($FLEETSHARD_OUTPUT_DIR) is uploaded as a blob (`HEAD`, then `PUT /api/v1/blobs/DIGEST` only when
missing), then the list is reported (`POST /api/v1/artifacts?hqe=N`) with what was skipped and why:
links, special files, names that are not text, and whatever passes MAX_OUTPUT_FILES files or
FLEETSHARD_MAX_OUTPUT_BYTES bytes. Everything is the job's, so nothing is followed: each directory and
file is opened by name under its parent's descriptor, without following links (shard/run/executor.py's
open_regular). Once reported, a marker in the run directory (the shard's again) says so; before that, a restart
sends the same files again, which costs the master nothing (it has the blobs and replaces the rows).
"""

import contextlib
import errno
import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import requests
from django.conf import settings

from common.blobs import CHUNK, MAX_OUTPUT_FILES, MAX_OUTPUT_PATH_CHARS, MAX_SKIPPED_LISTED
from common.network import request_failure
from common.wire import has_unsafe_chars
from shard.run.executor import UnsafeFile, open_regular
from shard.sync.client import MasterUnavailable, error_of, master_session

log = logging.getLogger(__name__)

OUTPUTS = "outputs"
# In the run's directory (the shard's again once it ended): a job that made this name itself only
# keeps its own outputs from being sent.
SENT_MARKER = ".fleetshard-outputs-sent"
MAX_DEPTH = 32
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Scan:
    files: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[dict[str, object]] = field(default_factory=list)
    unlisted: int = 0
    total: int = 0

    def skip(self, path: str, size: int, reason: str) -> None:
        if len(self.skipped) < MAX_SKIPPED_LISTED:
            self.skipped.append({"path": path, "size": size, "reason": reason})
        else:
            self.unlisted += 1

    def report_body(self, stored: list[dict[str, object]]) -> dict[str, object]:
        skipped = list(self.skipped)
        if self.unlisted:
            skipped.append(
                {
                    "path": f"+{self.unlisted} more",
                    "size": 0,
                    "reason": f"{self.unlisted} more files skipped, not listed",
                }
            )
        return {"files": stored, "skipped": _unique(stored, skipped)}


def _unique(stored: list[dict[str, object]], skipped: list[dict[str, object]]) -> list[dict[str, object]]:
    """Skipped names as shown can coincide (names not UTF-8, or too long, shown cleaned and cut): each
    gets a `~N` suffix, since the master refuses a list naming a path twice, and with it every row."""
    used = {str(f["path"]) for f in stored}
    out = []
    for item in skipped:
        shown = path = str(item["path"])
        n = 1
        while path in used:
            n += 1
            suffix = f"~{n}"
            path = f"{shown[: MAX_OUTPUT_PATH_CHARS - len(suffix)]}{suffix}"
        used.add(path)
        out.append({**item, "path": path})
    return out


def _name(raw: str, prefix: str) -> str | None:
    path = f"{prefix}{raw}"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return None
    if has_unsafe_chars(path) or len(path) > MAX_OUTPUT_PATH_CHARS:
        return None
    return path


def scan_outputs(outputs_fd: int, max_files: int, max_bytes: int) -> Scan:
    """What a run left: files to send (path, size) in name order, and what is skipped with its reason."""
    scan = Scan()
    _scan_dir(outputs_fd, "", 0, scan, max_files, max_bytes)
    return scan


def _scan_dir(dir_fd: int, prefix: str, depth: int, scan: Scan, max_files: int, max_bytes: int) -> None:
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        path = _name(entry.name, prefix)
        shown = path or f"{prefix}{entry.name.encode('utf-8', 'replace').decode('utf-8', 'replace')}"
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if path is None:
            scan.skip(_safe(shown), 0, "its name is not UTF-8 text, or too long")
        elif stat.S_ISLNK(info.st_mode):
            scan.skip(path, 0, "a symbolic link: not followed")
        elif stat.S_ISDIR(info.st_mode):
            if depth >= MAX_DEPTH:
                scan.skip(path, 0, f"a directory nested deeper than {MAX_DEPTH}: not read")
                continue
            try:
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                scan.skip(path, 0, f"a directory that cannot be opened ({exc.strerror})")
                continue
            try:
                _scan_dir(sub, f"{path}/", depth + 1, scan, max_files, max_bytes)
            finally:
                os.close(sub)
        elif not stat.S_ISREG(info.st_mode):
            scan.skip(path, 0, "not a regular file (a device, fifo or socket)")
        elif len(scan.files) >= max_files:
            scan.skip(path, info.st_size, f"over the limit of {max_files} output files a run")
        elif scan.total + info.st_size > max_bytes:
            scan.skip(path, info.st_size, f"over FLEETSHARD_MAX_OUTPUT_BYTES ({max_bytes} bytes a run)")
        else:
            scan.files.append((path, info.st_size))
            scan.total += info.st_size


def _safe(text: str) -> str:
    cleaned = "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else "?" for c in text)
    return cleaned[:MAX_OUTPUT_PATH_CHARS] or "?"


def open_output(outputs_fd: int, path: str, owners: tuple[int, ...]) -> int:
    """Opens `path` under the outputs without following any link; raises OSError (UnsafeFile)."""
    parts = path.split("/")
    fd = outputs_fd
    opened: list[int] = []
    try:
        for part in parts[:-1]:
            fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            opened.append(fd)
        return open_regular(parts[-1], os.O_RDONLY, owners, dir_fd=fd)
    finally:
        for each in opened:
            os.close(each)


def _sha256_fd(fd: int, limit: int) -> tuple[str, int]:
    """(SHA-256, size) of the file's first `limit` bytes at most: the size it had when the outputs
    were scanned. A process the run left behind may still be writing it; read to its end, the file
    could grow as fast as it is read (the uploader never done) and past FLEETSHARD_MAX_OUTPUT_BYTES."""
    hasher = hashlib.sha256()
    size = 0
    os.lseek(fd, 0, os.SEEK_SET)
    while size < limit and (chunk := os.read(fd, min(CHUNK, limit - size))):
        hasher.update(chunk)
        size += len(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return hasher.hexdigest(), size


class _Limited:
    """A file read as exactly `size` bytes, the Content-Length sent: one that grew is cut there, one
    that shrank since it was hashed is padded (the master then refuses its digest) rather than
    leaving the master waiting for bytes that never come, and the uploader for its timeout."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.left = size
        self.size = size
        self.padded = False

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        n = min(CHUNK, self.left)
        if not n:
            return b""
        data = os.read(self.fd, n)
        if not data:
            self.padded = True
            data = bytes(n)
        self.left -= len(data)
        return data


class OutputSender:
    def __init__(self, master_url: str, token: str, timeout_s: float = 30.0) -> None:
        base = master_url.rstrip("/") + "/api/v1/"
        self.blob_url = base + "blobs/"
        self.report_url = base + "artifacts"
        self.session = master_session(token)
        self.timeout = (5.0, timeout_s)

    def _call(self, method: str, url: str, **kwargs: object) -> requests.Response:
        try:
            return self.session.request(method, url, timeout=self.timeout, **kwargs)  # type: ignore[arg-type]
        except requests.RequestException as exc:
            raise MasterUnavailable(f"cannot reach the master: {request_failure(exc)}") from exc

    def put(self, fd: int, digest: str, size: int) -> str:
        """Uploads the file unless the master has it; '' once it is there, else why it never will be."""
        head = self._call("HEAD", self.blob_url + digest)
        if head.status_code == 200:
            return ""
        body = _Limited(fd, size)
        resp = self._call(
            "PUT",
            self.blob_url + digest,
            data=body,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        if resp.status_code in (200, 201):
            return ""
        if body.padded:
            return "it shrank while it was sent (something still writes it): not stored"
        if resp.status_code in (400, 411, 413):
            return f"the master refused it ({resp.status_code}): {error_of(resp)}"
        raise MasterUnavailable(f"the master answered {resp.status_code} to an output upload: {error_of(resp)}")

    def report(self, hqe_id: int, body: dict[str, object]) -> None:
        resp = self._call("POST", self.report_url, params={"hqe": str(hqe_id)}, json=body)
        if resp.status_code == 200:
            return
        if resp.status_code in (400, 403, 404):
            log.warning(
                "HQE %s: the master refused its outputs list (%s): %s", hqe_id, resp.status_code, error_of(resp)
            )
            return
        raise MasterUnavailable(f"the master answered {resp.status_code} to an outputs list: {error_of(resp)}")


def upload_outputs(run_fd: int, hqe_id: int, sender: OutputSender, owners: tuple[int, ...], max_bytes: int) -> None:
    """Sends one ended run's outputs, once. Raises MasterUnavailable: a later pass sends them again."""
    with contextlib.suppress(FileNotFoundError):
        os.stat(SENT_MARKER, dir_fd=run_fd, follow_symlinks=False)
        return
    try:
        outputs_fd = os.open(OUTPUTS, DIR_FLAGS, dir_fd=run_fd)
    except OSError as exc:
        reason = "a link, not a directory" if exc.errno == errno.ELOOP else exc.strerror
        log.warning("HQE %s: its outputs/ cannot be opened (%s): not uploaded", hqe_id, reason)
        _mark_sent(run_fd)
        return
    try:
        scan = scan_outputs(outputs_fd, MAX_OUTPUT_FILES, max_bytes)
        stored: list[dict[str, object]] = []
        for path, scanned in scan.files:
            try:
                fd = open_output(outputs_fd, path, owners)
            except UnsafeFile as exc:
                scan.skip(path, 0, f"not sent: {exc}")
                continue
            except OSError as exc:
                scan.skip(path, 0, f"cannot open it ({exc.strerror})")
                continue
            try:
                digest, size = _sha256_fd(fd, scanned)
                refused = sender.put(fd, digest, size)
            finally:
                os.close(fd)
            if refused:
                scan.skip(path, size, refused)
            else:
                stored.append({"path": path, "size": size, "digest": digest})
        if stored or scan.skipped or scan.unlisted:
            sender.report(hqe_id, scan.report_body(stored))
            log.info("HQE %s: %d outputs uploaded, %d skipped", hqe_id, len(stored), len(scan.skipped) + scan.unlisted)
    finally:
        os.close(outputs_fd)
    _mark_sent(run_fd)


def _mark_sent(run_fd: int) -> None:
    with contextlib.suppress(FileExistsError):
        os.close(
            os.open(
                SENT_MARKER,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=run_fd,
            )
        )


def has_outputs(run_fd: int) -> bool:
    """Whether the run has an `outputs/` (runs started before outputs existed have none)."""
    try:
        os.stat(OUTPUTS, dir_fd=run_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def max_output_bytes() -> int:
    return int(getattr(settings, "FLEETSHARD_MAX_OUTPUT_BYTES", 1024**3))


def make_outputs_dir(run_dir: Path) -> Path:
    path = run_dir / OUTPUTS
    path.mkdir(mode=0o700)
    return path
