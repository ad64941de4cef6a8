"""The shard-wide cache of job inputs, under $FLEETSHARD_DATA_DIR/cache (docs/blobs.md).

One download per digest however many runs, schedulers or `run_shard` processes want it: a process
takes the digest's fetch lock (an flock, so processes sharing the directory agree) and checks again
before downloading. A run in progress holds a shared lock on the digest's use lock; eviction (least
recently used first, past FLEETSHARD_CACHE_BYTES) takes it exclusively without waiting, so a blob in
use is never removed. A blob is checked (SHA-256) when it arrives and again whenever its file is no
longer the one checked (size, mtime, inode): a cache file changed behind the shard's back is
fetched again. Downloads resume with `Range` after a broken connection or a restart.

Files are the shard's and read-only (0444, directories 0555 or 0711): a job, run as another user,
reads them by name and changes nothing.
"""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from common.blobs import CHUNK, MAX_TAR_MEMBERS, InputRef
from common.network import request_failure
from shard.sync.client import master_session

log = logging.getLogger(__name__)

# How long a download keeps trying after the master went away (a restart, a network blip).
RETRY_FOR_S = 120.0


class CacheError(Exception):
    """An input cannot be had (refused, missing, corrupt, too large, unsafe): its run fails as infra."""


class Fetcher:
    """Downloads blobs from the master as this shard."""

    def __init__(self, master_url: str, token: str, timeout_s: float = 30.0, retry_for_s: float = RETRY_FOR_S) -> None:
        self.url = master_url.rstrip("/") + "/api/v1/blobs/"
        self.token = token
        self.timeout = (5.0, timeout_s)
        self.retry_for_s = retry_for_s
        self.session: requests.Session | None = None

    def fetch(self, digest: str, size: int, part: Path) -> tuple[int, str]:
        """Fills `part` with the blob (resuming what it holds); returns (bytes downloaded, the
        SHA-256 of the whole file), hashed as it arrives: the file is not read again."""
        deadline = time.monotonic() + self.retry_for_s
        got = 0
        failures = 0
        while True:
            try:
                written, sha = self._fetch_once(digest, size, part)
                return got + written, sha
            except _Broken as exc:
                got += exc.got
                failures += 1
                if time.monotonic() >= deadline:
                    raise CacheError(f"blob {digest}: the download kept failing: {exc}") from None
                log.warning("blob %s: download broke off (%s); resuming", digest[:12], exc)
                time.sleep(min(5.0, 0.2 * 2**failures))

    def _fetch_once(self, digest: str, size: int, part: Path) -> tuple[int, str]:
        if self.session is None:
            self.session = master_session(self.token)
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        if have == size:
            part.touch()  # a 0-byte blob: nothing to download, and no partial file yet
            return 0, _sha256(part)
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            resp = self.session.get(self.url + digest, headers=headers, stream=True, timeout=self.timeout)
        except requests.RequestException as exc:
            raise _Broken(request_failure(exc), 0) from None
        with resp:
            if resp.status_code in (401, 403, 404):
                raise CacheError(f"blob {digest}: the master refused it ({resp.status_code}): {_error_of(resp)}")
            if resp.status_code == 416:
                part.unlink(missing_ok=True)
                raise _Broken("the partial download was longer than the blob", 0)
            if resp.status_code not in (200, 206):
                raise _Broken(f"the master answered {resp.status_code}", 0)
            resumed = resp.status_code == 206
            start = have if resumed else 0
            hasher = _hasher_of(part) if resumed else hashlib.sha256()
            written = 0
            try:
                with open(part, "ab" if resumed else "wb") as out:
                    for chunk in resp.iter_content(CHUNK):
                        written += len(chunk)
                        if start + written > size:
                            out.close()
                            part.unlink(missing_ok=True)
                            raise CacheError(f"blob {digest}: the master sent more than the {size} bytes announced")
                        hasher.update(chunk)
                        out.write(chunk)
            except requests.RequestException as exc:
                raise _Broken(request_failure(exc), written) from None
        if start + written < size:
            raise _Broken(f"the download ended after {start + written} of {size} bytes", written)
        return written, hasher.hexdigest()


class _Broken(Exception):
    def __init__(self, message: str, got: int) -> None:
        super().__init__(message)
        self.got = got


def _error_of(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.reason or ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


@dataclass
class Pin:
    """A run's hold on a cached blob: while held, eviction leaves the blob alone."""

    digest: str
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Stamp:
    """Which file was checked: a changed size, mtime or inode means checking it again."""

    size: int
    mtime_ns: int
    ino: int

    @classmethod
    def of(cls, info: os.stat_result) -> "Stamp":
        return cls(info.st_size, info.st_mtime_ns, info.st_ino)


class BlobCache:
    def __init__(self, root: Path, max_bytes: int, fetcher: Fetcher, max_blob_bytes: int | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.fetcher = fetcher
        self.max_blob_bytes = max_blob_bytes
        self.downloads = 0
        for name, mode in (
            ("", 0o711),
            ("blobs", 0o711),
            ("trees", 0o711),
            ("partial", 0o700),
            ("locks", 0o700),
            ("stamps", 0o700),
        ):
            path = root / name
            path.mkdir(parents=True, exist_ok=True)
            if stat.S_IMODE(path.stat().st_mode) != mode:
                path.chmod(mode)

    # Where things are.

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest

    def tree_path(self, digest: str) -> Path:
        return self.root / "trees" / digest

    def _stamp_path(self, digest: str, what: str = "blob") -> Path:
        return self.root / "stamps" / f"{digest}.{what}"

    def _lock(self, digest: str, what: str) -> int:
        return os.open(self.root / "locks" / f"{digest}.{what}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    # What a run asks for.

    def acquire(self, ref: InputRef) -> tuple[Path, Pin]:
        """The input, present and checked (a file, or the directory its tar unpacks to), and a pin on it."""
        if self.max_blob_bytes is not None and ref.size > self.max_blob_bytes:
            raise CacheError(
                f"input {ref.name}: {ref.size} bytes is over FLEETSHARD_MAX_INPUT_BYTES ({self.max_blob_bytes})"
            )
        try:
            pin = Pin(ref.digest, self._lock(ref.digest, "use"))
        except OSError as exc:
            raise CacheError(f"input {ref.name}: the shard's cache cannot be used: {exc}") from None
        try:
            fcntl.flock(pin.fd, fcntl.LOCK_SH)
            if not self._ready(ref):
                fetch = self._lock(ref.digest, "fetch")
                try:
                    fcntl.flock(fetch, fcntl.LOCK_EX)
                    if not self._blob_ok(ref.digest, ref.size):
                        self._download(ref)
                    if ref.kind == "tar" and not self._tree_ok(ref.digest):
                        self._unpack(ref)
                finally:
                    os.close(fetch)
            self._touch(ref.digest)
        except OSError as exc:
            # The shard's own disk (full, or unwritable): the input cannot be had, the host is not to blame.
            pin.release()
            (self.root / "partial" / ref.digest).unlink(missing_ok=True)
            raise CacheError(f"input {ref.name}: the shard's cache cannot hold it: {exc}") from None
        except BaseException:
            pin.release()
            raise
        return (self.tree_path(ref.digest) if ref.kind == "tar" else self.blob_path(ref.digest)), pin

    def _ready(self, ref: InputRef) -> bool:
        return self._blob_ok(ref.digest, ref.size) and (ref.kind != "tar" or self._tree_ok(ref.digest))

    def _blob_ok(self, digest: str, size: int) -> bool:
        path = self.blob_path(digest)
        try:
            info = path.lstat()
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            log.warning("cache: blob %s is not the file it should be: fetching it again", digest[:12])
            self._drop_file(digest)
            return False
        if self._read_stamp(digest) == Stamp.of(info):
            return True
        if _sha256(path) != digest:
            log.warning("cache: blob %s does not match its digest (changed on disk): fetching it again", digest[:12])
            self._drop_file(digest)
            return False
        self._write_stamp(digest, Stamp.of(info))
        return True

    def _tree_ok(self, digest: str) -> bool:
        return self._stamp_path(digest, "tree").exists() and self.tree_path(digest).is_dir()

    def _download(self, ref: InputRef) -> None:
        part = self.root / "partial" / ref.digest
        started = time.monotonic()
        got, digest = self.fetcher.fetch(ref.digest, ref.size, part)
        if digest != ref.digest:
            part.unlink(missing_ok=True)
            raise CacheError(f"input {ref.name}: the download's SHA-256 is {digest}, not {ref.digest}")
        part.chmod(0o444)
        target = self.blob_path(ref.digest)
        os.replace(part, target)
        self._write_stamp(ref.digest, Stamp.of(target.lstat()))
        self.downloads += 1
        took = time.monotonic() - started
        log.info(
            "cache: downloaded blob %s for input %s: %d bytes in %.1f s",
            ref.digest[:12],
            ref.name,
            got,
            took,
        )

    def _unpack(self, ref: InputRef) -> None:
        tree = self.tree_path(ref.digest)
        staging = self.root / "partial" / f"{ref.digest}.tree"
        shutil.rmtree(staging, ignore_errors=True)
        _remove_tree(tree)
        staging.mkdir(mode=0o700)
        try:
            unpack_tar(self.blob_path(ref.digest), staging)
        except CacheError as exc:
            _remove_tree(staging)
            raise CacheError(f"input {ref.name}: {exc}") from None
        os.replace(staging, tree)
        tree.chmod(0o555)
        self._stamp_path(ref.digest, "tree").write_text(str(ref.size))

    def _read_stamp(self, digest: str) -> Stamp | None:
        try:
            data = json.loads(self._stamp_path(digest).read_text())
            return Stamp(int(data["size"]), int(data["mtime_ns"]), int(data["ino"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_stamp(self, digest: str, stamp: Stamp) -> None:
        path = self._stamp_path(digest)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"size": stamp.size, "mtime_ns": stamp.mtime_ns, "ino": stamp.ino}))
        os.replace(tmp, path)

    def _touch(self, digest: str) -> None:
        """Used now: the least recently used blobs go first."""
        with contextlib.suppress(OSError):
            os.utime(self._stamp_path(digest))

    def _drop_file(self, digest: str) -> None:
        """The blob's file only: its unpacked tree came from it when it was checked, and runs may be reading it."""
        with contextlib.suppress(OSError):
            os.chmod(self.blob_path(digest), 0o600)
        self.blob_path(digest).unlink(missing_ok=True)
        self._stamp_path(digest).unlink(missing_ok=True)

    def _drop_blob(self, digest: str) -> None:
        with contextlib.suppress(OSError):
            os.chmod(self.blob_path(digest), 0o600)
        self.blob_path(digest).unlink(missing_ok=True)
        self._stamp_path(digest).unlink(missing_ok=True)
        self._stamp_path(digest, "tree").unlink(missing_ok=True)
        _remove_tree(self.tree_path(digest))

    # Eviction.

    def entries(self) -> list[tuple[float, str, int]]:
        """(last use, digest, bytes held) of each cached blob, the unpacked tree counted as its tar's size.

        A blob whose stamp is gone (a crash between the rename and the stamp) still counts its bytes,
        as the least recently used: it would otherwise never count towards the bound.
        """
        out = []
        for entry in os.scandir(self.root / "blobs"):
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            try:
                used = self._stamp_path(entry.name).stat().st_mtime
            except OSError:
                used = 0.0
            held = size * (2 if self._stamp_path(entry.name, "tree").exists() else 1)
            out.append((used, entry.name, held))
        return sorted(out)

    def evict(self) -> int:
        """Removes least recently used blobs not in use until the cache fits, and unpacked trees whose
        blob is gone (a corrupt one dropped and not fetched again); returns how many blobs went."""
        entries = self.entries()
        total = sum(held for _, _, held in entries)
        removed = 0
        for _, digest, held in entries:
            if total <= self.max_bytes:
                break
            if self._drop_unused(digest):
                total -= held
                removed += 1
                log.info(
                    "cache: evicted blob %s (%d bytes): the cache is over %d bytes", digest[:12], held, self.max_bytes
                )
        for entry in os.scandir(self.root / "trees"):
            if not self.blob_path(entry.name).exists() and self._drop_unused(entry.name):
                log.info("cache: removed the unpacked tree of blob %s, which is no longer cached", entry.name[:12])
        return removed

    def _drop_unused(self, digest: str) -> bool:
        """Drops the blob and its tree unless a run holds them; whether it did."""
        fd = self._lock(digest, "use")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            self._drop_blob(digest)
        finally:
            os.close(fd)
        return True


def _hasher_of(path: Path) -> "hashlib._Hash":
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher


def _sha256(path: Path) -> str:
    return _hasher_of(path).hexdigest()


def _remove_tree(path: Path) -> None:
    """Removes a read-only tree: its directories are made writable first."""
    if not path.exists():
        return
    for dirpath, dirnames, _ in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o700)
        for name in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), 0o700, follow_symlinks=False)
    shutil.rmtree(path, ignore_errors=True)


# tarfile reads a pax or GNU long-name header whole: bounded before it is read.
MAX_TAR_HEADER_BYTES = 1 << 20
_META_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses an oversized extended header or an old GNU sparse member before tarfile reads it."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > MAX_TAR_HEADER_BYTES:
            raise CacheError(f"a tar header of {self.size} bytes (over {MAX_TAR_HEADER_BYTES}): not a tar of files")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise CacheError(f"the tar member {self.name[:120]!r} is a sparse file: only plain files and directories")
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]


def _member_path(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts:
        raise CacheError(f"the tar member {name[:120]!r} would land outside the input")
    return parts


def _check_members(tar: tarfile.TarFile, tar_bytes: int) -> list[tarfile.TarInfo]:
    """Every member, checked, before anything is written: what it unpacks to is bounded by the tar itself."""
    members: list[tarfile.TarInfo] = []
    seen: set[tuple[str, ...]] = set()
    total = 0
    for member in tar:
        if len(members) >= MAX_TAR_MEMBERS:
            raise CacheError(f"the tar has more than {MAX_TAR_MEMBERS} members")
        name = member.name
        parts = tuple(_member_path(name))
        if member.issparse():
            raise CacheError(f"the tar member {name[:120]!r} is a sparse file: only plain files and directories")
        if not (member.isreg() or member.isdir()):
            raise CacheError(f"the tar member {name[:120]!r} is a link or a special file: only files and directories")
        if parts in seen:
            raise CacheError(f"the tar member {name[:120]!r} is there twice")
        seen.add(parts)
        total += member.size if member.isreg() else 0
        if total > tar_bytes:
            raise CacheError(f"the tar's members add up to more than the tar's own {tar_bytes} bytes")
        members.append(member)
    return members


def unpack_tar(tar_path: Path, into: Path) -> None:
    """Unpacks an input's tar: regular files and directories only, every path inside `into`.

    A member that climbs out (`..`, an absolute path), a link, a device, a fifo, a sparse file, a
    name given twice, more than MAX_TAR_MEMBERS members or an extended header over
    MAX_TAR_HEADER_BYTES refuses the whole input: a job's inputs are what its owner packed, and
    `fleetshard job create` packs no such thing. What is written is at most the tar's own size.
    Files become read-only (0444, or 0555 when executable), directories 0555; no setuid bit is kept.
    """
    try:
        with tarfile.open(tar_path, "r:", tarinfo=_BoundedTarInfo) as tar:
            members = _check_members(tar, tar_path.stat().st_size)
            for member in members:
                target = into.joinpath(*_member_path(member.name))
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    raise CacheError(f"the tar member {member.name[:120]!r} cannot be read")
                with source, open(target, "xb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                target.chmod(0o555 if member.mode & 0o111 else 0o444)
    except (tarfile.TarError, OSError, RecursionError, ValueError) as exc:
        # RecursionError: tarfile follows a chain of extended headers by recursion.
        raise CacheError(f"not a readable tar: {str(exc)[:200] or type(exc).__name__}") from None
    for dirpath, _, _ in os.walk(into, topdown=False):
        os.chmod(dirpath, 0o555)
