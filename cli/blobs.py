"""Job inputs and outputs on the command line: `job create --input PATH[:NAME]` packs, hashes and
uploads (only what the master lacks), `job artifacts ID [--get PATH]` lists and downloads outputs.

A directory is packed as a tar with sorted names, zero times and owners and plain modes, so the same
content gives the same bytes (and the same digest: a second job with it uploads nothing). Links are
refused: a shard unpacks only files and directories.
"""

import contextlib
import hashlib
import os
import stat
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click
import requests

from cli.client import API_PREFIX, Api, CliError
from common.blobs import CHUNK, INPUT_NAME_RE, MAX_TAR_MEMBERS

# Uploads this large show a progress bar (on a terminal).
PROGRESS_FROM_BYTES = 16 * 1024 * 1024


@dataclass
class Packed:
    name: str
    path: Path
    kind: str
    digest: str
    size: int
    temporary: bool = False


def parse_input(spec: str) -> tuple[Path, str]:
    """`PATH[:NAME]` -> (path, name); NAME defaults to the path's base name."""
    path, name = spec, ""
    if not os.path.exists(spec) and ":" in spec:
        path, name = spec.rsplit(":", 1)
    resolved = Path(path)
    if not resolved.exists():
        raise click.BadParameter(f"{path}: no such file or directory", param_hint="--input")
    name = name or resolved.resolve().name
    if not INPUT_NAME_RE.fullmatch(name):
        raise click.BadParameter(
            f"input name {name!r}: use letters, digits, '.', '_', '+' or '-' (give PATH:NAME)", param_hint="--input"
        )
    return resolved, name


def _sha256(path: Path) -> tuple[str, int]:
    hasher = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(name in the tar, path) of everything under `root`, names sorted, parents first."""

    def unreadable(exc: OSError) -> None:
        raise CliError(f"--input {root}: cannot read {exc.filename}: {exc.strerror}")

    # A directory that cannot be read would otherwise be packed empty, silently.
    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        dirnames.sort()
        base = Path(dirpath)
        rel = base.relative_to(root).as_posix()
        for name in sorted(dirnames + filenames):
            path = base / name
            yield (name if rel == "." else f"{rel}/{name}"), path


def pack_dir(root: Path, out: IO[bytes]) -> None:
    """Writes `root` as a deterministic tar to `out`; raises CliError on a link or a special file."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for count, (name, path) in enumerate(_walk(root), 1):
            if count > MAX_TAR_MEMBERS:
                raise CliError(
                    f"--input {root}: more than {MAX_TAR_MEMBERS} files and directories (a shard unpacks no more)"
                )
            info = path.lstat()
            member = tarfile.TarInfo(name)
            member.mtime = 0
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            if stat.S_ISDIR(info.st_mode):
                member.type = tarfile.DIRTYPE
                member.mode = 0o755
                tar.addfile(member)
            elif stat.S_ISREG(info.st_mode):
                member.size = info.st_size
                member.mode = 0o755 if info.st_mode & 0o111 else 0o644
                with open(path, "rb") as handle:
                    tar.addfile(member, handle)
            else:
                kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                raise CliError(f"--input {root}: {name} is {kind}: an input holds only files and directories")


def pack(path: Path, name: str) -> Packed:
    """The input as a blob: a file as it is, a directory as its tar (in a temporary file)."""
    try:
        return _pack(path, name)
    except OSError as exc:
        raise CliError(f"--input {path}: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}") from None


def _pack(path: Path, name: str) -> Packed:
    if path.is_dir():
        tmp = tempfile.NamedTemporaryFile(prefix="fleetshard-input-", suffix=".tar", delete=False)  # noqa: SIM115
        try:
            with tmp:
                pack_dir(path, tmp)
            digest, size = _sha256(Path(tmp.name))
        except BaseException:
            os.unlink(tmp.name)
            raise
        return Packed(name, Path(tmp.name), "tar", digest, size, temporary=True)
    if not path.is_file():
        raise CliError(f"--input {path}: not a file or a directory")
    digest, size = _sha256(path)
    return Packed(name, path, "file", digest, size)


class _Reader:
    """A file read for an upload, moving a progress bar; requests takes its length from __len__."""

    def __init__(self, handle: IO[bytes], size: int, bar: Any) -> None:
        self.handle = handle
        self.size = size
        self.left = size
        self.bar = bar

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        # A chunk of our own size, whatever http.client asks (its 8-16 KiB blocks cost a third of the rate).
        # Exactly the length announced: a file that grew since it was hashed is cut there, one that
        # shrank is padded, and the master refuses the digest instead of waiting for the rest.
        want = min(CHUNK, self.left)
        data = self.handle.read(want) if want else b""
        if want and not data:
            data = bytes(want)
        self.left -= len(data)
        if self.bar is not None and data:
            self.bar.update(len(data))
        return data


def upload(api: Api, packed: Packed) -> bool:
    """Puts the blob on the master unless it has it; True when it was sent."""
    api.require_token()
    url = f"{api.server}{API_PREFIX}/blobs/{packed.digest}"
    headers = {"Authorization": f"Bearer {api.token}"}
    try:
        head = api.session.head(url, headers=headers, timeout=(5, api.timeout))
    except requests.RequestException as exc:
        raise api._unreachable(exc) from None
    if head.status_code == 200:
        return False
    if head.status_code != 404:
        api._result(head)
    show = sys.stderr.isatty() and packed.size >= PROGRESS_FROM_BYTES
    with open(packed.path, "rb") as handle, contextlib.ExitStack() as stack:
        bar = (
            stack.enter_context(
                click.progressbar(length=packed.size, label=f"uploading {packed.name}", file=sys.stderr)
            )
            if show
            else None
        )
        try:
            resp = api.session.put(
                url,
                data=_Reader(handle, packed.size, bar),
                headers={**headers, "Content-Type": "application/octet-stream", "Accept": "application/json"},
                # A large upload takes as long as it takes: only each wait for the server is bounded.
                timeout=(5, max(api.timeout, 300.0)),
            )
        except requests.RequestException as exc:
            raise api._unreachable(exc, broke_off=True) from None
    api._result(resp)
    return True


def prepare_inputs(api: Api, specs: tuple[str, ...]) -> list[dict[str, Any]]:
    """Packs, hashes and uploads each `--input`; the job's `inputs` list."""
    parsed = [parse_input(spec) for spec in specs]
    names = [name for _, name in parsed]
    if len(set(names)) != len(names):
        raise click.BadParameter("two inputs have the same name: give PATH:NAME", param_hint="--input")
    inputs = []
    for path, name in parsed:
        packed = pack(path, name)
        try:
            sent = upload(api, packed)
        finally:
            if packed.temporary:
                packed.path.unlink(missing_ok=True)
        click.echo(
            f"input {name}: {packed.kind}, {packed.size} bytes, sha256 {packed.digest[:12]}"
            f"{' (uploaded)' if sent else ' (the master had it)'}",
            err=True,
        )
        inputs.append({"name": name, "digest": packed.digest, "size": packed.size, "kind": packed.kind})
    return inputs


def download_blob(api: Api, digest: str, target: Path) -> int:
    """Downloads blob `digest` into `target` (written beside it, renamed once its SHA-256 matches).

    A target that is not a regular file (a device such as /dev/null, a fifo, a terminal) is written
    into as it is, never replaced; a directory gets the file under `name`'s base name (see
    `output_target`). A link is written through, to the file it names.
    """
    hasher = hashlib.sha256()
    size = 0

    class _Hashing:
        def __init__(self, out: IO[bytes]) -> None:
            self.out = out

        def write(self, data: bytes) -> None:
            nonlocal size
            hasher.update(data)
            size += len(data)
            self.out.write(data)

    def _check() -> None:
        if hasher.hexdigest() != digest:
            raise CliError(f"the download's SHA-256 is {hasher.hexdigest()}, not {digest}: nothing was written")

    if target.exists() and not target.is_file():
        try:
            with open(target, "wb") as out:
                api.download(f"/blobs/{digest}", _Hashing(out), {})
        except OSError as exc:
            raise CliError(f"-o {target}: {exc.strerror or exc}") from None
        if hasher.hexdigest() != digest:
            raise CliError(
                f"the download's SHA-256 is {hasher.hexdigest()}, not {digest}: do not trust what was written"
            )
        return size
    target = target.resolve() if target.is_symlink() else target
    tmp = target.with_name(f".{target.name}.part")
    try:
        with open(tmp, "wb") as out:
            api.download(f"/blobs/{digest}", _Hashing(out), {})
        _check()
        os.replace(tmp, target)
    except OSError as exc:
        raise CliError(f"-o {target}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return size


def output_target(output: str | None, path: str) -> Path:
    """Where `--get PATH [-o FILE]` writes: FILE, or PATH's base name in FILE when it is a directory."""
    base = Path(path).name
    if not output:
        return Path(base)
    target = Path(output)
    return target / base if target.is_dir() else target
