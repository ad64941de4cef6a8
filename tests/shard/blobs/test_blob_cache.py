"""The shard's input cache (shard/blobs/cache.py): one download per digest however many runs and
processes want it, checked before use (a changed file is fetched again), pinned while in use and
evicted least recently used, kept across restarts; tars unpacked read-only and only when safe;
downloads that break off resume with Range against a real HTTP server on loopback."""

import errno
import fcntl
import hashlib
import io
import multiprocessing
import os
import stat
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.blobs import InputRef
from shard.blobs.cache import BlobCache, CacheError, Fetcher, unpack_tar


class LocalFetcher(Fetcher):
    """Serves blobs from a dict; each download is counted in a file, so processes add up."""

    def __init__(self, blobs: dict[str, bytes], count_file: Path, delay_s: float = 0.0) -> None:
        super().__init__("http://127.0.0.1:9", "unused")
        self.blobs = blobs
        self.count_file = count_file
        self.delay_s = delay_s

    def fetch(self, digest: str, size: int, part: Path) -> tuple[int, str]:
        with open(self.count_file, "a") as f:
            f.write(digest + "\n")
        time.sleep(self.delay_s)
        data = self.blobs[digest]
        part.write_bytes(data)
        return len(data), hashlib.sha256(data).hexdigest()


def downloads(count_file: Path) -> int:
    return len(count_file.read_text().split()) if count_file.exists() else 0


def ref(name: str, data: bytes, kind: str = "file") -> InputRef:
    return InputRef(name, hashlib.sha256(data).hexdigest(), len(data), kind)


def tar_of(members: dict[str, bytes | None], links: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return out.getvalue()


@pytest.fixture
def world(tmp_path):
    blobs: dict[str, bytes] = {}
    count = tmp_path / "count"

    def cache(max_bytes: int = 1 << 30, delay_s: float = 0.0) -> BlobCache:
        return BlobCache(tmp_path / "cache", max_bytes, LocalFetcher(blobs, count, delay_s), 1 << 20)

    def add(name: str, data: bytes, kind: str = "file") -> InputRef:
        r = ref(name, data, kind)
        blobs[r.digest] = data
        return r

    return cache, add, count


def test_three_runs_of_one_input_download_it_once_and_read_it_read_only(world):
    cache, add, count = world
    model = add("model.bin", b"weights" * 1000)
    c = cache()
    held = [c.acquire(model) for _ in range(3)]
    assert downloads(count) == 1
    path = held[0][0]
    assert all(p == path for p, _ in held)
    assert path.read_bytes() == b"weights" * 1000
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    # A restarted shard (a new cache on the same directory) has it still.
    cache().acquire(model)
    assert downloads(count) == 1


def _acquire_in_process(root: str, data: bytes, count: str, ready: str) -> None:
    r = ref("m", data)
    c = BlobCache(Path(root), 1 << 30, LocalFetcher({r.digest: data}, Path(count), delay_s=0.5))
    while not os.path.exists(ready):
        time.sleep(0.01)
    path, _ = c.acquire(r)
    assert path.read_bytes() == data


def test_processes_sharing_the_cache_download_once(tmp_path):
    data = b"shared" * 5000
    ready = tmp_path / "go"
    fork = multiprocessing.get_context("fork")
    procs = [
        fork.Process(
            target=_acquire_in_process, args=(str(tmp_path / "cache"), data, str(tmp_path / "count"), str(ready))
        )
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    ready.touch()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert downloads(tmp_path / "count") == 1


def test_a_cache_file_changed_on_disk_is_detected_and_fetched_again(world):
    cache, add, count = world
    model = add("model.bin", b"good bytes" * 100)
    c = cache()
    path, pin = c.acquire(model)
    pin.release()
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.write(b"BAD")
    path2, _ = c.acquire(model)
    assert downloads(count) == 2
    assert path2.read_bytes() == b"good bytes" * 100


def test_eviction_takes_the_least_recently_used_blob_never_one_in_use(world):
    cache, add, count = world
    a, b, d = add("a", b"a" * 1000), add("b", b"b" * 1000), add("d", b"d" * 1000)
    c = cache(max_bytes=2500)
    _, pin_a = c.acquire(a)  # held by a run all along
    time.sleep(0.02)
    _, pin_b = c.acquire(b)
    pin_b.release()
    time.sleep(0.02)
    _, pin_d = c.acquire(d)
    assert c.evict() == 1
    assert c.blob_path(a.digest).exists() and c.blob_path(d.digest).exists()
    assert not c.blob_path(b.digest).exists()
    # Over the limit with everything in use: nothing goes.
    c.max_bytes = 10
    assert c.evict() == 0
    pin_a.release()
    assert c.evict() == 1 and not c.blob_path(a.digest).exists()
    pin_d.release()


def test_an_oversized_or_corrupt_download_is_refused_and_nothing_is_kept(world):
    cache, add, count = world
    c = cache()
    with pytest.raises(CacheError, match="FLEETSHARD_MAX_INPUT_BYTES"):
        c.acquire(InputRef("huge", "0" * 64, 3 * 1024**3, "file"))
    lying = add("m", b"real")
    c.fetcher.blobs[lying.digest] = b"fake"  # type: ignore[attr-defined]
    with pytest.raises(CacheError, match="SHA-256"):
        c.acquire(lying)
    assert list((c.root / "blobs").iterdir()) == [] and list((c.root / "partial").iterdir()) == []


def test_a_directory_input_is_unpacked_once_read_only(world):
    cache, add, count = world
    tree = add("data", tar_of({"d": None, "d/a.txt": b"A", "top.txt": b"T"}), "tar")
    c = cache()
    path, _ = c.acquire(tree)
    again, _ = c.acquire(tree)
    assert path == again and downloads(count) == 1
    assert (path / "d" / "a.txt").read_bytes() == b"A" and (path / "top.txt").read_bytes() == b"T"
    assert stat.S_IMODE(path.stat().st_mode) == 0o555
    assert stat.S_IMODE((path / "d" / "a.txt").stat().st_mode) == 0o444


@pytest.mark.parametrize(
    "members,links,why",
    [
        ({"../escape.txt": b"x"}, {}, "outside"),
        ({"/etc/evil": b"x"}, {}, "outside"),
        ({"a/../../b": b"x"}, {}, "outside"),
        ({"ok.txt": b"x"}, {"link": "/etc/passwd"}, "link"),
        ({"ok.txt": b"x"}, {"inner": "ok.txt"}, "link"),
    ],
)
def test_an_unsafe_tar_is_refused_whole(world, members, links, why):
    cache, add, count = world
    bad = add("bad", tar_of(members, links), "tar")
    c = cache()
    with pytest.raises(CacheError, match=why):
        c.acquire(bad)
    assert list((c.root / "trees").iterdir()) == []


def test_a_device_or_hard_link_in_a_tar_is_refused(tmp_path):
    for kind in (tarfile.CHRTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            info = tarfile.TarInfo("thing")
            info.type = kind
            info.linkname = "other"
            tar.addfile(info)
        path = tmp_path / f"t{kind!r}.tar"
        path.write_bytes(out.getvalue())
        into = tmp_path / f"into{ord(kind)}"
        into.mkdir()
        with pytest.raises(CacheError, match="special file"):
            unpack_tar(path, into)
        assert list(into.iterdir()) == []


class _BreakingServer(BaseHTTPRequestHandler):
    """Serves DATA: the first answer breaks off half way (a master restarting), later ones honour Range."""

    data = b""
    ranges: list[str] = []
    status = 200

    def do_GET(self) -> None:  # noqa: N802
        if self.status != 200:
            self.send_response(self.status)
            self.send_header("Content-Type", "application/json")
            body = b'{"error": "not yours"}'
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        header = self.headers.get("Range", "")
        type(self).ranges.append(header)
        start = int(header.removeprefix("bytes=").rstrip("-")) if header else 0
        body = self.data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if len(type(self).ranges) == 1:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    _BreakingServer.ranges = []
    _BreakingServer.status = 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _BreakingServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def test_a_download_that_breaks_off_resumes_with_range(server, tmp_path):
    data = os.urandom(3 << 20)
    _BreakingServer.data = data
    r = ref("m", data)
    c = BlobCache(tmp_path / "cache", 1 << 30, Fetcher(f"http://127.0.0.1:{server.server_port}", "t", retry_for_s=20))
    path, _ = c.acquire(r)
    assert path.read_bytes() == data
    assert _BreakingServer.ranges[0] == "" and _BreakingServer.ranges[1].startswith("bytes=")
    assert int(_BreakingServer.ranges[1].removeprefix("bytes=").rstrip("-")) > 0


def test_a_refused_download_fails_at_once_with_the_masters_reason(server, tmp_path):
    _BreakingServer.status = 403
    c = BlobCache(tmp_path / "cache", 1 << 30, Fetcher(f"http://127.0.0.1:{server.server_port}", "t"))
    with pytest.raises(CacheError, match="refused it \\(403\\): not yours"):
        c.acquire(ref("m", b"x"))


def test_a_corrupt_tar_is_fetched_again_without_pulling_its_tree_from_under_a_run(world):
    cache, add, count = world
    tree = add("data", tar_of({"a.txt": b"A"}), "tar")
    c = cache()
    path, pin = c.acquire(tree)  # a run reads the tree all along
    blob = c.blob_path(tree.digest)
    blob.chmod(0o644)
    blob.write_bytes(b"x" * tree.size)
    again, _ = c.acquire(tree)
    assert downloads(count) == 2 and again == path
    assert (path / "a.txt").read_bytes() == b"A"
    pin.release()


def _tar_path(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    path = tmp_path / "input.tar"
    path.write_bytes(data)
    into = tmp_path / "into"
    into.mkdir()
    return path, into


def test_a_sparse_tar_bomb_is_refused_before_anything_is_written(tmp_path):
    """A few hundred bytes of tar claiming a 10 GiB sparse file would fill the shard's disk with zeros."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("bomb")
        info.pax_headers = {
            "GNU.sparse.major": "0",
            "GNU.sparse.minor": "1",
            "GNU.sparse.name": "bomb",
            "GNU.sparse.size": str(10 << 30),
            "GNU.sparse.map": f"{10 << 30},0",
        }
        tar.addfile(info, io.BytesIO(b""))
    path, into = _tar_path(tmp_path, out.getvalue())
    with pytest.raises(CacheError, match="sparse file"):
        unpack_tar(path, into)
    assert list(into.iterdir()) == []


def test_a_tar_that_would_unpack_to_more_than_itself_is_refused(tmp_path):
    data = bytearray(tar_of({"small.txt": b"x" * 10}))
    # The size field of the only member's header (octal, offset 124) now claims 4 GiB.
    header = bytearray(data[:512])
    header[124:136] = b"%011o\0" % (4 << 30)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    path, into = _tar_path(tmp_path, bytes(header) + bytes(data[512:]))
    with pytest.raises(CacheError, match="more than the tar's own"):
        unpack_tar(path, into)
    assert list(into.iterdir()) == []


def test_a_huge_extended_header_or_too_many_members_or_a_name_twice_is_refused(tmp_path, monkeypatch):
    import shard.blobs.cache as blob_cache

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a")
        info.pax_headers = {"comment": "x" * (2 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    path, into = _tar_path(tmp_path, out.getvalue())
    with pytest.raises(CacheError, match="tar header of"):
        unpack_tar(path, into)
    path.write_bytes(tar_of({"same.txt": b"1", "./same.txt": b"2"}))
    with pytest.raises(CacheError, match="there twice"):
        unpack_tar(path, into)
    monkeypatch.setattr(blob_cache, "MAX_TAR_MEMBERS", 3)
    path.write_bytes(tar_of({f"f{n}": b"" for n in range(4)}))
    with pytest.raises(CacheError, match="more than 3 members"):
        unpack_tar(path, into)
    assert list(into.iterdir()) == []


def test_a_chain_of_extended_headers_is_refused_as_a_cache_error(tmp_path):
    """tarfile follows long-name headers by recursion: a long chain of them is not a crash of the shard."""
    block = tarfile.TarInfo("././@LongLink")
    block.type = tarfile.GNUTYPE_LONGNAME
    name = b"n" * 10 + b"\0"
    block.size = len(name)
    one = block.tobuf(tarfile.GNU_FORMAT) + name.ljust(512, b"\0")
    path, into = _tar_path(tmp_path, one * 5000 + tar_of({"f": b"x"}))
    with pytest.raises(CacheError, match="not a readable tar"):
        unpack_tar(path, into)
    assert list(into.iterdir()) == []


def test_a_setuid_bit_in_a_tar_is_not_kept(tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("tool")
        info.mode = 0o4755
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    path, into = _tar_path(tmp_path, out.getvalue())
    unpack_tar(path, into)
    assert stat.S_IMODE((into / "tool").stat().st_mode) == 0o555


class _DiskFullFetcher(LocalFetcher):
    def fetch(self, digest: str, size: int, part: Path) -> tuple[int, str]:
        part.write_bytes(self.blobs[digest][: size // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(part))


def test_a_full_disk_is_a_cache_error_naming_the_input_and_leaves_no_partial_file(tmp_path):
    """An OSError from the shard's own disk failed the run as if the host were to blame (repaired)."""
    data = b"weights" * 1000
    r = ref("weights", data)
    c = BlobCache(tmp_path / "cache", 1 << 30, _DiskFullFetcher({r.digest: data}, tmp_path / "count"), 1 << 20)
    with pytest.raises(CacheError, match="input weights: the shard's cache cannot hold it: .*No space left"):
        c.acquire(r)
    assert list((c.root / "partial").iterdir()) == [] and list((c.root / "blobs").iterdir()) == []
    # The pin was let go: eviction may take the digest's use lock at once.
    assert c.evict() == 0
    fd = c._lock(r.digest, "use")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_blob_without_its_stamp_and_a_tree_without_its_blob_are_evicted(world):
    """Both were invisible to eviction: the first counted 0 bytes, the second was never listed."""
    cache, add, count = world
    plain = add("plain", b"p" * 1000)
    tree = add("tree", tar_of({"f.txt": b"x"}), "tar")
    c = cache(max_bytes=10)
    for r in (plain, tree):
        c.acquire(r)[1].release()
    c._stamp_path(plain.digest).unlink()
    c._drop_file(tree.digest)  # as when it was found corrupt, and not fetched again
    assert c.tree_path(tree.digest).is_dir()
    _, pin = c.acquire(plain)  # in use: stays
    c._stamp_path(plain.digest).unlink()
    assert c.evict() == 0 and c.blob_path(plain.digest).exists()
    assert not c.tree_path(tree.digest).exists()
    pin.release()
    assert c.evict() == 1
    assert list((c.root / "blobs").iterdir()) == [] and list((c.root / "trees").iterdir()) == []


def test_an_empty_input_is_had_without_a_download(server, tmp_path):
    """A 0-byte file is a blob like any other: the fetcher hashed a partial file that did not exist."""
    _BreakingServer.data = b""
    c = BlobCache(tmp_path / "cache", 1 << 30, Fetcher(f"http://127.0.0.1:{server.server_port}", "t"))
    path, pin = c.acquire(ref("empty", b""))
    assert path.read_bytes() == b"" and _BreakingServer.ranges == []
    pin.release()
