"""What a run leaves in $FLEETSHARD_OUTPUT_DIR, as the shard reads it (shard/blobs/outputs.py): regular
files in name order up to the limits, and everything else skipped with its reason, never followed."""

import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import shard.blobs.outputs
from shard.blobs.outputs import DIR_FLAGS, OutputSender, open_output, scan_outputs, upload_outputs
from shard.run.executor import UnsafeFile


def scan(path, max_files=1000, max_bytes=1 << 30):
    fd = os.open(path, DIR_FLAGS)
    try:
        return scan_outputs(fd, max_files, max_bytes)
    finally:
        os.close(fd)


def test_files_are_listed_and_links_and_special_files_skipped_with_their_reason(tmp_path):
    out = tmp_path / "outputs"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_bytes(b"A")
    (out / "sub" / "b.bin").write_bytes(b"BB")
    (out / "link").symlink_to("/etc/passwd")
    (out / "dirlink").symlink_to(tmp_path)
    os.mkfifo(out / "pipe")
    result = scan(out)
    assert result.files == [("a.txt", 1), ("sub/b.bin", 2)]
    reasons = {s["path"]: s["reason"] for s in result.skipped}
    assert reasons == {
        "dirlink": "a symbolic link: not followed",
        "link": "a symbolic link: not followed",
        "pipe": "not a regular file (a device, fifo or socket)",
    }


def test_files_over_the_count_or_byte_limits_are_skipped_and_listed(tmp_path):
    out = tmp_path / "outputs"
    out.mkdir()
    for n in range(5):
        (out / f"f{n}").write_bytes(b"x" * 10)
    by_count = scan(out, max_files=3)
    assert [p for p, _ in by_count.files] == ["f0", "f1", "f2"]
    assert [s["path"] for s in by_count.skipped] == ["f3", "f4"]
    assert "over the limit of 3 output files" in str(by_count.skipped[0]["reason"])
    by_bytes = scan(out, max_bytes=25)
    assert [p for p, _ in by_bytes.files] == ["f0", "f1"]
    assert "FLEETSHARD_MAX_OUTPUT_BYTES" in str(by_bytes.skipped[0]["reason"])


def test_a_hundred_thousand_tiny_files_are_cut_at_a_thousand_quickly(tmp_path):
    out = tmp_path / "outputs"
    out.mkdir()
    for n in range(100_000):
        with open(out / f"f{n:06d}", "wb"):
            pass
    started = time.monotonic()
    result = scan(out)
    took = time.monotonic() - started
    assert len(result.files) == 1000
    assert len(result.skipped) == 1000 and result.unlisted == 98_000
    body = result.report_body([])
    assert body["skipped"][-1] == {"path": "+98000 more", "size": 0, "reason": "98000 more files skipped, not listed"}
    assert took < 20, took  # a generous bound: the point is that it ends, not how fast


def test_a_name_that_is_not_text_is_skipped(tmp_path):
    out = tmp_path / "outputs"
    out.mkdir()
    os.close(os.open(os.path.join(os.fsencode(out), b"bad\xff"), os.O_CREAT | os.O_WRONLY))
    result = scan(out)
    assert result.files == []
    assert result.skipped[0]["reason"] == "its name is not UTF-8 text, or too long"


def test_a_file_is_opened_without_following_a_link_swapped_in(tmp_path):
    out = tmp_path / "outputs"
    (out / "d").mkdir(parents=True)
    (out / "d" / "f").write_bytes(b"x")
    fd = os.open(out, DIR_FLAGS)
    try:
        os.close(open_output(fd, "d/f", (os.geteuid(),)))
        (out / "d" / "f").unlink()
        (out / "d" / "f").symlink_to("/etc/passwd")
        with pytest.raises(OSError):
            open_output(fd, "d/f", (os.geteuid(),))
        (out / "d" / "f").unlink()
        (out / "d" / "g").write_bytes(b"y")
        os.link(out / "d" / "g", out / "d" / "h")
        with pytest.raises(UnsafeFile, match="hard link"):
            open_output(fd, "d/h", (os.geteuid(),))
    finally:
        os.close(fd)


class _BlobServer(BaseHTTPRequestHandler):
    """A master's blob endpoint in miniature: reads the announced length, checks the digest."""

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    received: dict[str, bytes] = {}
    reports: list[dict] = []

    def do_POST(self) -> None:
        self.reports.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ok = hashlib.sha256(body).hexdigest() == self.path.rsplit("/", 1)[1]
        if ok:
            self.received[self.path.rsplit("/", 1)[1]] = body
        answer = b'{"digest": "x"}' if ok else b'{"error": "digest mismatch"}'
        self.send_response(201 if ok else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def test_a_file_that_shrinks_while_it_is_sent_is_skipped_at_once_not_retried_forever(tmp_path):
    """Its announced length is still sent (padded), so the master answers instead of waiting for bytes
    that never come; before, the upload hung until its timeout and the pass was tried again and again."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlobServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sender = OutputSender(f"http://127.0.0.1:{server.server_port}", "token", timeout_s=10)
        path = tmp_path / "trace.json"
        path.write_bytes(b"x" * 3_000_000)
        fd = os.open(path, os.O_RDONLY)
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert sender.put(fd, digest, 3_000_000) == ""
            os.lseek(fd, 0, os.SEEK_SET)
            os.truncate(path, 1000)
            started = time.monotonic()
            assert "shrank while it was sent" in sender.put(fd, digest, 3_000_000)
            assert time.monotonic() - started < 8  # not its 10 s timeout (with room for a loaded machine)
        finally:
            os.close(fd)
    finally:
        server.shutdown()
        server.server_close()


def test_a_file_still_growing_is_sent_as_it_was_scanned_within_the_byte_limit(tmp_path, monkeypatch):
    """A process the run left behind may still write its outputs: each file is read up to the size it
    had when scanned. Read to its end, it could outgrow FLEETSHARD_MAX_OUTPUT_BYTES, or be written as
    fast as it is read and keep the uploader hashing for ever."""
    run = tmp_path / "run"
    (run / "outputs").mkdir(parents=True)
    log = run / "outputs" / "log.txt"
    log.write_bytes(b"a" * 1000)
    real_scan = scan_outputs

    def scan_then_grow(fd: int, max_files: int, max_bytes: int):
        found = real_scan(fd, max_files, max_bytes)
        with open(log, "ab") as f:
            f.write(b"b" * 5_000_000)
        return found

    monkeypatch.setattr(shard.blobs.outputs, "scan_outputs", scan_then_grow)
    _BlobServer.received.clear()
    _BlobServer.reports.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlobServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    run_fd = os.open(run, DIR_FLAGS)
    try:
        sender = OutputSender(f"http://127.0.0.1:{server.server_port}", "token", timeout_s=10)
        upload_outputs(run_fd, 7, sender, (os.geteuid(),), 2000)
    finally:
        os.close(run_fd)
        server.shutdown()
        server.server_close()
    digest = hashlib.sha256(b"a" * 1000).hexdigest()
    assert _BlobServer.received == {digest: b"a" * 1000}
    assert _BlobServer.reports == [{"files": [{"path": "log.txt", "size": 1000, "digest": digest}], "skipped": []}]


def test_names_that_look_the_same_once_cleaned_are_listed_apart(tmp_path):
    """Two names that are not UTF-8 (or two over-long ones) showed the same; the master refuses a list
    naming a path twice, so every output of the run went unlisted."""
    out = tmp_path / "outputs"
    out.mkdir()
    for raw in (b"bad\xff", b"bad\xfe"):
        os.close(os.open(os.path.join(os.fsencode(out), raw), os.O_CREAT | os.O_WRONLY))
    (out / "bad?").write_bytes(b"x")
    long_name = "L" * 250
    deep = out / ("D" * 250) / ("D" * 250) / ("D" * 250) / ("D" * 250)
    deep.mkdir(parents=True)
    for tail in ("a", "b"):
        (deep / (long_name + tail)).write_bytes(b"")
    result = scan(out, max_files=1000)
    stored = [{"path": p, "size": size, "digest": "0" * 64} for p, size in result.files]
    body = result.report_body(stored)
    paths = [str(f["path"]) for f in body["files"]] + [str(s["path"]) for s in body["skipped"]]
    assert len(paths) == len(set(paths)) == 5 and "bad?" in paths
    assert all(len(p) <= 1024 for p in paths)
