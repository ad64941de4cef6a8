"""`fleetshard results upload`: result files made outside fleetshard, from a spool directory to the master.

Built to run from cron every minute, several at once on one directory: each file is taken under a
non-blocking `flock`, so exactly one uploader handles it, and it is only ever in one of three places
(the data dir, the archive, the quarantine), each move a single rename. Killed between the upload
and the move, the file stays in the data dir and the next run's upload is answered "already
stored" (the master keys runs on the file's digest), so it is archived without a duplicate.
"""

import ctypes
import errno
import fcntl
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cli.action import Run, action
from cli.client import CliError
from cli.output import emit_json, printable
from common.constants import MAX_RESULT_FILE_BYTES

UPLOAD_PATH = "/results/upload"
SUFFIX = ".json"


@dataclass
class Outcome:
    """What became of one file; `--json` prints these."""

    file: str
    status: str  # uploaded, quarantined, kept or skipped
    reason: str | None = None
    run: int | None = None
    entries: int | None = None
    created: bool | None = None
    moved_to: str | None = None  # the path in the archive or quarantine

    def line(self) -> str:
        name = printable(self.file)
        if self.status == "uploaded":
            again = "" if self.created else ", already stored"
            entries = f"{self.entries} entr{'y' if self.entries == 1 else 'ies'}"
            return f"uploaded {name}: run {self.run} ({entries}){again}"
        # The master's reasons may start with the file's name: said once is enough.
        reason = (self.reason or "").removeprefix(f"{self.file}: ")
        return f"{self.status} {name}: {printable(reason)}"


class _Stop(Exception):
    """Every later upload would fail the same way (no answer, the token refused): stop taking files."""


def candidates(data_dir: Path) -> tuple[list[str], list[Outcome]]:
    """Names of the regular `.json` files, oldest first (mtime, then name), and the entries skipped."""
    files: list[tuple[int, str]] = []
    skipped: list[Outcome] = []
    with os.scandir(data_dir) as entries:
        for entry in entries:
            if not entry.name.endswith(SUFFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                skipped.append(Outcome(entry.name, "skipped", "a symbolic link, not followed"))
            elif not stat.S_ISREG(st.st_mode):
                skipped.append(Outcome(entry.name, "skipped", "not a regular file"))
            else:
                files.append((st.st_mtime_ns, entry.name))
    files.sort()
    return [name for _, name in files], sorted(skipped, key=lambda o: o.file)


@contextmanager
def taken(data_dir: Path, name: str) -> Iterator[int | str]:
    """The file's descriptor under an exclusive flock, or why it is not ours to handle: held by another
    uploader, or gone (another uploader moved it; the empty string says nothing worth printing)."""
    path = data_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        yield ""
        return
    except OSError as exc:
        yield "a symbolic link, not followed" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}"
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            yield "not a regular file"
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "held by another uploader"
            return
        # The lock may have been released by an uploader that just moved this file away.
        if not _same_file(path, st):
            yield ""
            return
        yield fd
    finally:
        os.close(fd)  # releases the lock, after the file has left the data dir


def _same_file(path: Path, st: os.stat_result) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _read(fd: int) -> bytes | None:
    """The file's bytes, or None when it is larger than the master would take (it may grow as we read)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESULT_FILE_BYTES:
            return None
    return b"".join(chunks)


_libc: Any = None


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Moves `src` to `dst` in one step, failing with FileExistsError rather than replacing a file.

    Linux's renameat2(RENAME_NOREPLACE) does both at once; where it is missing (another kernel, a file
    system without it) an existence check before rename() leaves a window only between uploaders
    sharing an archive dir that archive the same name in the same instant."""
    global _libc
    if sys.platform.startswith("linux"):
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_noreplace = -100, 1
        fn = getattr(_libc, "renameat2", None)
        if fn is not None:
            if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace) == 0:
                return
            err = ctypes.get_errno()
            if err not in (errno.ENOSYS, errno.EINVAL):
                raise OSError(err, os.strerror(err), str(src), None, str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def _unique_names(name: str) -> Iterator[str]:
    """`name`, then `STEM.TIME.json` names for a clash: an archive keeps every file, never overwriting one."""
    yield name
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    yield f"{stem}.{stamp}{SUFFIX}"
    for n in range(2, 10_000):
        yield f"{stem}.{stamp}-{n}{SUFFIX}"


def move(src: Path, to_dir: Path, note: str | None = None) -> Path:
    """Moves `src` into `to_dir` under a free name; with `note`, writes `NAME.error` holding it first,
    so a quarantined file is never without its reason (killed in between, the note alone is left)."""
    for name in _unique_names(src.name):
        dst = to_dir / name
        if note is not None:
            try:
                fd = os.open(f"{dst}.error", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
                out.write(note + "\n")
        try:
            _rename_noreplace(src, dst)
        except FileExistsError:
            if note is not None:
                os.unlink(f"{dst}.error")
            continue
        except BaseException:
            if note is not None:
                os.unlink(f"{dst}.error")
            raise
        return dst
    raise FileExistsError(errno.EEXIST, f"no free name for {src.name}", str(to_dir))


class Uploader:
    def __init__(self, run: Run, data_dir: Path, archive_dir: Path, quarantine_dir: Path) -> None:
        self.run = run
        self.data_dir = data_dir
        self.archive_dir = archive_dir
        self.quarantine_dir = quarantine_dir

    def handle(self, name: str) -> Outcome | None:
        """Uploads and moves one file; None when it is not ours (another uploader took it)."""
        with taken(self.data_dir, name) as got:
            if isinstance(got, str):
                return Outcome(name, "skipped", got) if got else None
            data = None if os.fstat(got).st_size > MAX_RESULT_FILE_BYTES else _read(got)
            if data is None:
                return self._quarantine(name, f"{name}: larger than {MAX_RESULT_FILE_BYTES} bytes: not uploaded")
            try:
                answer = self.run.api.request("POST", UPLOAD_PATH, params={"name": name}, data=data)
            except CliError as exc:
                if exc.status == 413:
                    return self._quarantine(name, exc.reply or f"{name}: larger than the master accepts (413)")
                if exc.status == 400 and exc.reply:
                    return self._quarantine(name, exc.reply)
                kept = Outcome(name, "kept", exc.message)
                if exc.status is None or exc.status in (401, 403, 404):
                    raise _Stop(kept) from None
                return kept
            run = answer.get("run") if isinstance(answer, dict) else None
            if not isinstance(run, dict) or not isinstance(answer.get("created"), bool):
                raise _Stop(Outcome(name, "kept", f"the server at {self.run.api.server} did not answer as a master"))
            outcome = Outcome(
                name, "uploaded", run=run.get("id"), entries=run.get("entries"), created=answer["created"]
            )
            return self._moved(outcome, self.archive_dir, None)

    def _quarantine(self, name: str, reason: str) -> Outcome:
        return self._moved(Outcome(name, "quarantined", reason), self.quarantine_dir, reason)

    def _moved(self, outcome: Outcome, to_dir: Path, note: str | None) -> Outcome:
        try:
            to_dir.mkdir(parents=True, exist_ok=True)
            outcome.moved_to = str(move(self.data_dir / outcome.file, to_dir, note))
        except OSError as exc:
            where = f"{to_dir}: {exc.strerror or exc}"
            if exc.errno == errno.EXDEV:
                where = f"{to_dir} is not on the data dir's file system (files are moved with one rename)"
            done = "uploaded" if outcome.status == "uploaded" else "not uploaded"
            # A directory that refuses one file refuses the next: stop rather than upload them all again.
            raise _Stop(Outcome(outcome.file, "kept", f"{done}, but cannot move it to {where}", outcome.run)) from None
        return outcome


def _dir(value: str | None, name: str) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise CliError(f"invalid {name} {printable(value)!r}: not a directory")
    return path


@click.command("upload")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, dir_okay=True),
    metavar="DIR",
    help="Where result files (NAME.json) wait; write them elsewhere and rename them in, or hold a flock on "
    "them while writing.",
)
@click.option("--archive-dir", required=True, metavar="DIR", help="Where uploaded files go (created if missing).")
@click.option(
    "--quarantine-dir",
    metavar="DIR",
    help="Where malformed files go, each with NAME.error saying why [default: DATA_DIR/quarantine].",
)
@action
def upload(run: Run, data_dir: str, archive_dir: str, quarantine_dir: str | None) -> None:
    """Upload result files, oldest first, then archive them; quarantine malformed ones.

    Several uploaders may share a directory: each file is handled by exactly one. Exits 0 when every
    file it took was archived or quarantined, 1 when one could not be uploaded (it stays for the next
    run). The directories must be on the data dir's file system: files are moved with one rename."""
    data = Path(data_dir)
    archive = _dir(archive_dir, "archive dir")
    quarantine = _dir(quarantine_dir, "quarantine dir") or data / "quarantine"
    assert archive is not None
    for other, what in ((archive, "archive dir"), (quarantine, "quarantine dir")):
        if other.exists() and os.path.samefile(other, data):
            raise CliError(f"invalid {what} {printable(str(other))!r}: it is the data dir")
    run.api.require_token()
    names, outcomes = candidates(data)
    uploader = Uploader(run, data, archive, quarantine)
    show = not run.as_json
    for skipped in outcomes:
        if show:
            click.echo(skipped.line())
    untried = 0
    with _progress(names, show) as bar:
        for i, name in enumerate(bar):
            try:
                outcome = uploader.handle(name)
            except _Stop as stop:
                outcome, untried = stop.args[0], len(names) - i - 1
            if outcome is not None:
                outcomes.append(outcome)
                if show:
                    _echo_above(bar, outcome.line())
            if untried:
                break
    if run.as_json:
        emit_json([asdict(o) for o in outcomes])
    elif outcomes:
        click.echo(_summary(outcomes, untried))
    elif sys.stdout.isatty():
        # A person who ran it by hand learns it looked; cron (no terminal) mails nothing every minute.
        click.echo(f"No result files in {printable(str(data))}.")
    kept = [o for o in outcomes if o.status == "kept"]
    if kept:
        left = len(kept) + untried
        raise CliError(
            f"{left} file{'s' if left != 1 else ''} not uploaded, left in {printable(str(data))} for the next run: "
            f"{kept[0].reason}"
        )


def _summary(outcomes: list[Outcome], untried: int) -> str:
    statuses = ("uploaded", "quarantined", "kept", "skipped")
    counts = [f"{sum(1 for o in outcomes if o.status == status)} {status}" for status in statuses]
    return ", ".join(counts + ([f"{untried} not tried (stopped)"] if untried else []))


class _NoBar:
    def __init__(self, items: list[str]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[str]:
        return iter(self.items)


@contextmanager
def _progress(names: list[str], show: bool) -> Iterator[Any]:
    """A bar on a terminal (never in --json or in a cron mail), else the plain list."""
    if show and names and sys.stdout.isatty():
        with click.progressbar(names, label="uploading", show_pos=True, item_show_func=_short) as bar:
            yield bar
    else:
        yield _NoBar(names)


def _short(name: str | None) -> str | None:
    return printable(name)[:40] if name else None


def _echo_above(bar: Any, line: str) -> None:
    if isinstance(bar, _NoBar):
        click.echo(line)
    else:
        click.echo("\r\x1b[K" + line)
        bar.render_progress()
