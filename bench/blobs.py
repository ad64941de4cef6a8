"""Job inputs at scale (issue 26): one input of `--size-mib` (1 GiB by default) fanned out to
`--hqes` (20) entries on one shard, on loopback, with SQLite databases in a temporary directory.

Run: `.venv/bin/python bench/blobs.py [--size-mib 1024] [--hqes 20] [--dir /dev/shm]`. It starts a real master
(`manage.py serve`, 1 worker) and a real shard (`run_shard`), and prints:
1. upload: the PUT of the blob (the CLI's own upload, its digest computed beforehand), MB/s;
2. download, master side: a GET streamed to nothing by this client, MB/s;
3. the shard: how many times it downloaded the blob for the job's entries (target: once), its
   download (written to its cache, digest checked) in MB/s, and the time until every entry ended;
4. peak RSS (VmHWM) of each master process and of the shard during all of it (target: under 150 MB).
Targets: at least 200 MB/s each way, one download, under 150 MB each.
"""

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.blobs import Packed, upload  # noqa: E402
from cli.client import Api  # noqa: E402
from tests.support import Role, free_port, stop, wait_until  # noqa: E402

MIB = 1024 * 1024


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the most resident memory the process ever had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pids: list[int]) -> float:
    """User plus system CPU seconds the processes have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except OSError:
                pass
    return sorted(pids)


def write_input(path: Path, size_mib: int) -> str:
    hasher = hashlib.sha256()
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for i in range(size_mib):
            chunk = block[i % 251 :] + block[: i % 251]  # distinct blocks, cheaply
            hasher.update(chunk)
            f.write(chunk)
    return hasher.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--hqes", type=int, default=20)
    parser.add_argument("--dir", help="where the databases, blobs and cache go (e.g. /dev/shm: no disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fs-bench-blobs-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        print(f"the disk under {tmp}: {disk_write_mb_s(tmp):.0f} MB/s to write 256 MiB and fsync it")
        run(tmp, args.size_mib, args.hqes)


def disk_write_mb_s(where: Path) -> float:
    """What the storage itself takes: the transfers cannot write faster than this."""
    path = where / "disk-probe"
    block = os.urandom(MIB)
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(256):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - started
    path.unlink()
    return 256 * MIB / took / 1e6


def run(tmp: Path, size_mib: int, hqes: int) -> None:
    master_dir, shard_dir = tmp / "master", tmp / "shard"
    master_dir.mkdir()
    shard_dir.mkdir()
    master = Role("master", f"sqlite:///{master_dir / 'master.sqlite3'}", master_dir)
    master.manage("migrate", "--noinput")
    made = master.shell(
        f"""
from master import services
services.create_labels(["board:bench"], acting_user=None)
shard, shard_token = services.create_shard("bench-shard", ["board:bench"], acting_user=None)
services.create_hosts([f"dut{{i}}" for i in range({hqes})], labels=["board:bench"], acting_user=None)
_, token = services.create_personal_token("bench", admin=True, acting_user=None)
result = {{"shard_token": shard_token, "token": token}}
"""
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = master.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name="master.log")
    shard_proc = None
    try:
        wait_until(lambda: _up(url), timeout=60, what="the master")
        data = tmp / "model.bin"
        started = time.perf_counter()
        digest = write_input(data, size_mib)
        print(
            f"input: {size_mib} MiB written and hashed in {time.perf_counter() - started:.1f} s (sha256 {digest[:12]})"
        )
        size = size_mib * MIB
        api = Api(url, made["token"])
        masters = group_pids(server.pid)
        cpu0 = cpu_s(masters)
        started = time.perf_counter()
        assert upload(api, Packed("model.bin", data, "file", digest, size))
        took = time.perf_counter() - started
        cpu = cpu_s(masters) - cpu0
        print(
            f"upload (PUT, streamed, digest checked by the master): {size / took / 1e6:.0f} MB/s ({took:.2f} s); "
            f"the master used {cpu:.2f} CPU s: {size / max(cpu, 1e-3) / 1e6:.0f} MB per CPU second"
        )

        headers = {"Authorization": f"Bearer {made['token']}"}
        cpu0 = cpu_s(masters)
        started = time.perf_counter()
        got = 0
        with requests.get(f"{url}/api/v1/blobs/{digest}", headers=headers, stream=True, timeout=60) as resp:
            resp.raise_for_status()
            for chunk in resp.iter_content(MIB):
                got += len(chunk)
        took = time.perf_counter() - started
        assert got == size
        cpu = cpu_s(masters) - cpu0
        print(
            f"download (GET to nothing, this client): {size / took / 1e6:.0f} MB/s ({took:.2f} s); "
            f"the master used {cpu:.2f} CPU s: {size / max(cpu, 1e-3) / 1e6:.0f} MB per CPU second"
        )

        job = api.post(
            "/jobs/",
            {
                "name": "fan-out",
                "command": 'test "$(stat -L -c %s "$FLEETSHARD_INPUT_DIR/model.bin")" -gt 0',
                "meta_hosts": [f"board:bench*{hqes}"],
                "inputs": [{"name": "model.bin", "digest": digest, "size": size, "kind": "file"}],
            },
        )
        data.unlink()  # the client's copy: only the master's and the shard's remain on disk
        shard = Role(
            "shard",
            f"sqlite:///{shard_dir / 'shard.sqlite3'}",
            shard_dir,
            {
                "FLEETSHARD_MASTER_URL": url,
                "FLEETSHARD_SHARD_HOSTNAME": "bench-shard",
                "FLEETSHARD_SHARD_TOKEN": made["shard_token"],
                "FLEETSHARD_SCHEDULER_TICK_S": "0.1",
                "FLEETSHARD_MAX_RUNS": str(hqes),
            },
        )
        shard.manage("migrate", "--noinput")
        started = time.perf_counter()
        shard_proc = shard.start("run_shard", log_name="shard.log")

        def ended() -> bool:
            statuses = [h["status"] for h in api.get(f"/jobs/{job['id']}/")["hqes"]]
            return all(s not in ("Queued", "Starting", "Running") for s in statuses)

        wait_until(ended, timeout=900, interval=0.5, what="every entry to end")
        took = time.perf_counter() - started
        log = (shard_dir / "shard.log").read_text()
        statuses = [h["status"] for h in api.get(f"/jobs/{job['id']}/")["hqes"]]
        lines = re.findall(r"cache: downloaded blob \S+ for input \S+: (\d+) bytes in ([\d.]+) s", log)
        print(f"shard: {len(lines)} download(s) for {hqes} entries; entries {sorted(set(statuses))}")
        shard_cpu = cpu_s([shard_proc.pid])
        print(f"shard: {shard_cpu:.1f} CPU s in all (download, digest, scheduling {hqes} runs)")
        for nbytes, secs in lines:
            print(
                f"shard download (to its cache, resumable, digest checked): "
                f"{int(nbytes) / max(float(secs), 1e-3) / 1e6:.0f} MB/s ({secs} s)"
            )
        print(f"shard: every entry ended {took:.1f} s after it started")
        for pid in group_pids(server.pid):
            print(f"master process {pid}: peak RSS {peak_rss_mb(pid):.0f} MB")
        print(f"shard process {shard_proc.pid}: peak RSS {peak_rss_mb(shard_proc.pid):.0f} MB")
    finally:
        if shard_proc is not None:
            stop(shard_proc, timeout=60)
        stop(server)


def _up(url: str) -> bool:
    try:
        return requests.get(url + "/admin/login/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    main()
