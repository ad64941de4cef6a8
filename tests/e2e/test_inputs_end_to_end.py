"""End to end: jobs that carry their inputs and bring back their outputs, through the command line,
a real master and real shards. Three runs of one directory input on one shard download it once,
read it and cannot change it; a second job with the same input uploads nothing; outputs come back
byte for byte; another shard is refused the blob; a cache file changed on disk is fetched again; a
master killed in the middle of an upload stores nothing, and one killed in the middle of a download
lets the shard resume."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.shard.fleet import master_hqes, new_shard, sql
from tests.support import ROOT, assert_status, serve, wait_until

pytestmark = pytest.mark.e2e

COMMAND = r"""
set -u
cp "$FLEETSHARD_INPUT_DIR/model/data.txt" "$FLEETSHARD_OUTPUT_DIR/copy.txt"
sh "$FLEETSHARD_INPUT_DIR/model/bin/run.sh" > "$FLEETSHARD_OUTPUT_DIR/ran.txt"
mkdir "$FLEETSHARD_OUTPUT_DIR/deep"
head -c 70000 "$FLEETSHARD_INPUT_DIR/model/blob.bin" > "$FLEETSHARD_OUTPUT_DIR/deep/blob.bin"
ln -s /etc/passwd "$FLEETSHARD_OUTPUT_DIR/passwd"
if (echo changed > "$FLEETSHARD_INPUT_DIR/model/data.txt") 2>/dev/null; then echo WROTE-INPUT; exit 3; fi
if touch "$FLEETSHARD_INPUT_DIR/model/new" 2>/dev/null; then echo ADDED-INPUT; exit 4; fi
if rm -f "$FLEETSHARD_INPUT_DIR/model" 2>/dev/null && [ ! -e "$FLEETSHARD_INPUT_DIR/model" ]; then exit 5; fi
if (echo x > "$(readlink "$FLEETSHARD_INPUT_DIR/model")/../evil") 2>/dev/null; then exit 6; fi
echo inputs-read-only
"""


def cli(master, token: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
    env |= {"FLEETSHARD_SERVER": master.url, "FLEETSHARD_TOKEN": token}
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def personal_token(master) -> str:
    return master.shell(
        "from master import services\n_, result = services.create_personal_token("
        f"'inputs-{os.urandom(3).hex()}', admin=True, acting_user=None)"
    )


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    (model / "bin").mkdir(parents=True)
    (model / "data.txt").write_text("the data the benchmark reads\n")
    (model / "bin" / "run.sh").write_text('echo "ran from $0"\n')
    (model / "blob.bin").write_bytes(os.urandom(100_000))
    return model


def downloads(shard) -> int:
    return shard.process.log().count("cache: downloaded blob")


def wait_done(master, job_id: int, timeout: float = 120) -> list:
    def ended():
        rows = master_hqes(master, [job_id])
        return rows if rows and all(r[1] not in ("Queued", "Starting", "Running") for r in rows) else None

    return wait_until(ended, timeout=timeout, what=f"job {job_id} to end")


def test_a_directory_input_is_downloaded_once_read_only_and_outputs_come_back(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=3)
    token = personal_token(master_server)
    model = model_dir(tmp_path)
    create = ["job", "create", "bench", "-m", f"{shard.label}*3", "-c", COMMAND, "--input", f"{model}:model", "--json"]
    first = cli(master_server, token, *create)
    assert "(uploaded)" in first.stderr
    job = json.loads(first.stdout)
    assert [i["name"] for i in job["inputs"]] == ["model"] and job["inputs"][0]["kind"] == "tar"
    digest = job["inputs"][0]["digest"]
    shard.process.start()
    try:
        rows = wait_done(master_server, job["id"])
        assert [r[1] for r in rows] == ["Completed"] * 3, rows
        assert downloads(shard) == 1

        # Outputs go up just after each entry ends, from the shard's upload thread.
        def outputs_of_all() -> dict[int, dict[str, dict]]:
            listed = json.loads(cli(master_server, token, "job", "artifacts", str(job["id"]), "--json").stdout)
            by_hqe: dict[int, dict[str, dict]] = {}
            for row in listed:
                by_hqe.setdefault(row["hqe"], {})[row["path"]] = row
            return by_hqe if len(by_hqe) == 3 else {}

        by_hqe = wait_until(outputs_of_all, timeout=60, interval=0.5, what="the outputs of the three entries")
        for rows_of in by_hqe.values():
            assert sorted(rows_of) == ["copy.txt", "deep/blob.bin", "passwd", "ran.txt"]
            assert rows_of["passwd"]["digest"] == "" and "symbolic link" in rows_of["passwd"]["skipped"]
        hqe = sorted(by_hqe)[0]
        out = tmp_path / "got.bin"
        cli(
            master_server,
            token,
            "job",
            "artifacts",
            str(job["id"]),
            "--get",
            "deep/blob.bin",
            "--hqe",
            str(hqe),
            "-o",
            str(out),
        )
        assert out.read_bytes() == (model / "blob.bin").read_bytes()[:70000]
        ambiguous = cli(master_server, token, "job", "artifacts", str(job["id"]), "--get", "copy.txt", check=False)
        assert ambiguous.returncode == 1 and "choose one with --hqe" in ambiguous.stderr
        copy = cli(
            master_server, token, "job", "artifacts", str(job["id"]), "--get", "copy.txt", "--hqe", str(hqe), "-o", "-"
        )
        assert copy.stdout == (model / "data.txt").read_text()

        # The cache is intact: the runs could not change it.
        cache = shard.process.role.data_dir / "cache"
        tar_bytes = (cache / "blobs" / digest).read_bytes()
        assert hashlib.sha256(tar_bytes).hexdigest() == digest
        assert (cache / "trees" / digest / "data.txt").read_text() == "the data the benchmark reads\n"
        assert not (cache / "trees" / "evil").exists()

        # The same input again: nothing uploaded, nothing downloaded.
        second = cli(master_server, token, *create)
        assert "(the master had it)" in second.stderr
        job2 = json.loads(second.stdout)
        assert [r[1] for r in wait_done(master_server, job2["id"])] == ["Completed"] * 3
        assert downloads(shard) == 1

        # Another shard's token is refused the blob; this shard's is not.
        other = master_server.shell(
            "from master import services\n"
            f"_, result = services.create_shard('other-{os.urandom(3).hex()}', [], acting_user=None)"
        )
        url = f"{master_server.url}/api/v1/blobs/{digest}"
        refused = requests.get(url, headers={"Authorization": f"Bearer {other}"}, timeout=10)
        assert refused.status_code == 403 and "neither an input nor an output" in refused.json()["error"]

        # A cache file changed on disk is noticed and fetched again before the next run uses it.
        blob = cache / "blobs" / digest
        blob.chmod(0o644)
        with open(blob, "r+b") as f:
            f.seek(100)
            f.write(b"corrupt")
        third = json.loads(cli(master_server, token, *create).stdout)
        assert [r[1] for r in wait_done(master_server, third["id"])] == ["Completed"] * 3
        assert "does not match its digest" in shard.process.log()
        assert downloads(shard) == 2
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
    finally:
        shard.process.stop()


def test_an_input_that_cannot_be_had_fails_the_entry_as_infra_with_the_reason(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_MAX_INPUT_BYTES="10")
    token = personal_token(master_server)
    model = model_dir(tmp_path)
    job = json.loads(
        cli(
            master_server,
            token,
            "job",
            "create",
            "big",
            "-m",
            shard.label,
            "-c",
            "true",
            "--input",
            str(model / "blob.bin"),
            "--json",
        ).stdout
    )
    shard.process.start()
    try:
        ((_, status, failure, _, _, tail),) = wait_done(master_server, job["id"])
        assert (status, failure) == ("Failed", "infra")
        assert "input blob.bin: 100000 bytes is over FLEETSHARD_MAX_INPUT_BYTES (10)" in tail
    finally:
        shard.process.stop()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_a_master_killed_mid_upload_stores_nothing_and_the_upload_then_succeeds(own_master, tmp_path):
    token = personal_token(own_master)
    data = os.urandom(8 << 20)
    digest = hashlib.sha256(data).hexdigest()
    port = int(own_master.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        f"PUT /api/v1/blobs/{digest} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(data)}\r\n\r\n".encode()
    )
    sock.sendall(data[: 3 << 20])
    staging = own_master.role.data_dir / "blobs" / ".incoming"
    wait_until(
        lambda: staging.exists() and any(f.stat().st_size > 0 for f in staging.iterdir()), what="the upload to start"
    )
    _kill_group(own_master.proc)
    sock.close()
    own_master.proc = serve(own_master.role, port)
    stored = own_master.role.data_dir / "blobs" / digest[:2] / digest[2:4] / digest
    assert not stored.exists()
    assert sql(own_master.role.database_url, "SELECT count(*) FROM master_blob")[0][0] == 0
    head = requests.head(f"{own_master.url}/api/v1/blobs/{digest}", headers={"Authorization": f"Bearer {token}"})
    assert_status(head, 404)
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    from cli.blobs import Packed, upload
    from cli.client import Api

    assert upload(Api(own_master.url, token), Packed("weights.bin", path, "file", digest, len(data))) is True
    assert stored.read_bytes() == data


def test_a_master_killed_mid_download_lets_the_shard_resume(own_master, tmp_path):
    shard = new_shard(own_master, tmp_path, hosts=1)
    token = personal_token(own_master)
    weights = tmp_path / "weights.bin"
    with open(weights, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    job = json.loads(
        cli(
            own_master,
            token,
            "job",
            "create",
            "w",
            "-m",
            shard.label,
            "-c",
            'cmp "$FLEETSHARD_INPUT_DIR/w" /dev/null; test -s "$FLEETSHARD_INPUT_DIR/w"',
            "--input",
            f"{weights}:w",
            "--json",
        ).stdout
    )
    digest = job["inputs"][0]["digest"]
    part = shard.process.role.data_dir / "cache" / "partial" / digest
    port = int(own_master.url.rsplit(":", 1)[1])
    shard.process.start()
    try:
        wait_until(lambda: part.exists(), timeout=60, interval=0.01, what="the download to start")
        os.killpg(own_master.proc.pid, signal.SIGSTOP)
        _kill_group(own_master.proc)
        own_master.proc = serve(own_master.role, port)
        ((_, status, failure, _, _, tail),) = wait_done(own_master, job["id"])
        chain = subprocess.run(
            ["namei", "-l", str(part.parent.parent / "blobs" / digest)], capture_output=True, text=True
        )
        assert (status, failure) == ("Completed", ""), tail + chain.stdout
        log = shard.process.log()
        assert "download broke off" in log and log.count("cache: downloaded blob") == 1
        cached = shard.process.role.data_dir / "cache" / "blobs" / digest
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == digest
    finally:
        shard.process.stop()


def test_a_huge_or_unmeasured_upload_is_refused_at_once_by_the_real_server(master_server):
    token = personal_token(master_server)
    digest = "0" * 64
    url = f"{master_server.url}/api/v1/blobs/{digest}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    port = int(master_server.url.rsplit(":", 1)[1])
    # 3 GiB announced, a few bytes sent: refused from the header, the body never read.
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"PUT /api/v1/blobs/{digest} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {3 * 1024**3}\r\n\r\nabc".encode()
        )
        answer = b""
        while b"FLEETSHARD_MAX_INPUT_BYTES" not in answer and (piece := sock.recv(65536)):
            answer += piece
    assert answer.startswith(b"HTTP/1.1 413") and b"FLEETSHARD_MAX_INPUT_BYTES" in answer

    # A streamed body without a length (chunked) is refused: the master must know the size first.
    def endless():
        for _ in range(4):
            yield b"x" * 65536

    streamed = requests.put(url, data=endless(), headers=headers, timeout=30)
    assert streamed.status_code == 411 and "Content-Length" in streamed.json()["error"]
    stored = master_server.role.data_dir / "blobs" / digest[:2] / digest[2:4] / digest
    assert not stored.exists()
    assert_status(requests.head(url, headers=headers, timeout=10), 404)
