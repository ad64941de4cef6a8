"""End to end: a shard finds its devices (a file, a command and a fake `adb` on PATH), the master
registers them, a device pulled out goes Missing with its run ended as an infra failure, and comes back."""

import json
import os
import stat
import time

import pytest

from tests.shard.sync.test_discovery import ADB_OUTPUT
from tests.support import make_shard_process, wait_until

pytestmark = pytest.mark.e2e

INTERVAL_S = 1.0


def hosts_on_master(master, prefix):
    return master.shell(
        f"""
from common.models import Host
result = {{h.hostname: [h.status, h.origin, h.shard.hostname if h.shard else None]
          for h in Host.objects.filter(discovered_by__hostname="{prefix}.lab").select_related("shard")}}
"""
    )


def test_devices_register_themselves_go_missing_and_come_back(master_server, tmp_path):
    prefix = "disc"
    world = master_server.shell(
        f"""
from master import services
services.create_labels(["{prefix}:board", "{prefix}:other"], acting_user=None)
shard, token = services.create_shard("{prefix}.lab", ["{prefix}:board"], acting_user=None)
services.create_shard("{prefix}.other", ["{prefix}:other"], acting_user=None)
result = {{"token": token}}
"""
    )
    devices = tmp_path / "devices.json"
    records = [{"hostname": f"{prefix}-d{i}", "labels": [f"{prefix}:board"]} for i in (1, 2)]
    records.append({"hostname": f"{prefix}-foreign", "labels": [f"{prefix}:other"]})
    devices.write_text(json.dumps(records))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    adb = bin_dir / "adb"
    adb.write_text(f"#!/bin/sh\ncat <<'END'\n{ADB_OUTPUT}END\n")
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)
    # A command source: one record a line (its hostname's case is not the device's identity).
    finder = bin_dir / "find-benches"
    finder.write_text(
        f"""#!/bin/sh\necho '{{"hostname": "{prefix.upper()}-Bench1", "labels": ["{prefix}:board"]}}'\n"""
    )
    finder.chmod(finder.stat().st_mode | stat.S_IXUSR)
    shard = make_shard_process(
        tmp_path,
        master_server,
        f"{prefix}.lab",
        world["token"],
        FLEETSHARD_DISCOVERY=f"file:{devices},adb,command:{finder}",
        FLEETSHARD_DISCOVERY_INTERVAL_S=str(INTERVAL_S),
        FLEETSHARD_DISCOVERY_LABELS=f"{prefix}:board",
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )
    shard.start()
    try:
        expected = {f"{prefix}-d1", f"{prefix}-d2", f"{prefix}-bench1"}
        expected |= {"adb-r58m12abcde", "adb-emulator-5554", "adb-192.168.1.20:5555"}
        wait_until(lambda: set(hosts_on_master(master_server, prefix)) == expected, timeout=30, what="devices")
        assert all(v[1:] == ["discovered", f"{prefix}.lab"] for v in hosts_on_master(master_server, prefix).values())
        rejected = master_server.shell(
            f"""
from common.models import Shard
result = Shard.objects.get(hostname="{prefix}.lab").discovered_rejected
"""
        )
        assert rejected == [
            {
                "hostname": f"{prefix}-foreign",
                "reason": f"label {prefix}:other belongs to shard {prefix}.other, not {prefix}.lab",
            }
        ]
        job = master_server.shell(
            f"""
from master import services
job = services.create_job(services.JobRequest(name="long", owner="ana", command="sleep 60",
      hosts=["{prefix}-d1"], meta_hosts=[]), acting_user=None)
result = job.hqes.get().id
"""
        )
        hqe = (
            "from common.models import HostQueueEntry\n"
            f"h = HostQueueEntry.objects.get(id={job})\nresult = [h.status, h.failure, h.log_tail]"
        )
        wait_until(lambda: master_server.shell(hqe)[0] == "Running", timeout=30, what="the run to start")
        devices.write_text(json.dumps(records[1:]))
        pulled = time.monotonic()
        wait_until(lambda: master_server.shell(hqe)[0] == "Failed", timeout=30, what="the run to fail")
        took = time.monotonic() - pulled
        status, failure, tail = master_server.shell(hqe)
        assert failure == "infra" and f"host {prefix}-d1 vanished" in tail
        # Two discovery intervals plus a heartbeat (0.5 s), with room for a busy machine: each poll
        # above starts a Django process, which took up to 2 s at a load of 12 on two cores.
        assert took < 2 * INTERVAL_S + 0.5 + 8, took
        assert hosts_on_master(master_server, prefix)[f"{prefix}-d1"][0] == "Missing"
        time.sleep(2 * INTERVAL_S)
        assert hosts_on_master(master_server, prefix)[f"{prefix}-d1"][0] == "Missing"
        devices.write_text(json.dumps(records))
        wait_until(
            lambda: hosts_on_master(master_server, prefix)[f"{prefix}-d1"][0] in ("Ready", "Cleaning"),
            timeout=30,
            what="the device to come back",
        )
    finally:
        code = shard.stop()
    assert code == 0
    assert "the master refused discovered host disc-foreign" in shard.log()
