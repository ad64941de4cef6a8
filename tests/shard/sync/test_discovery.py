"""Discovery on the shard (shard/sync/discovery.py): its sources, the set and its generation, and the ack."""

import contextlib
import json
import logging
import os
import resource
import signal
import stat
import time
from pathlib import Path

import pytest

from common.models import Host
from common.wire import DiscoveredAck, Rejection
from shard.models import DiscoveryState
from shard.sync import discovery
from shard.sync.discovery import (
    clean_hostname,
    discovery_request,
    note_ack,
    parse_adb_devices,
    parse_sources,
    record_set,
    run_sources,
)
from tests.support import wait_until

# Real `adb devices -l` output: a phone online, one offline, one unauthorized, an emulator, a device
# over TCP, and adb's own chatter.
ADB_OUTPUT = """\
* daemon not running; starting now at tcp:5037
* daemon started successfully
List of devices attached
R58M12ABCDE            device usb:1-1.2 product:beyond1lteeea model:SM_G973F device:beyond1 transport_id:3
0a1b2c3d4e5f           offline usb:1-1.3 transport_id:4
ZY2239XYZ              unauthorized usb:1-1.4 transport_id:5
emulator-5554          device product:sdk_gphone64_x86_64 model:sdk_gphone64_x86_64 device:emu64xa transport_id:1
192.168.1.20:5555      device product:panther model:Pixel_7 device:panther transport_id:6

"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_adb_output_registers_only_devices_online(settings):
    settings.FLEETSHARD_DISCOVERY_LABELS = "board:phone, lab:x"
    records = parse_adb_devices(ADB_OUTPUT)
    assert [r["hostname"] for r in records] == ["adb-r58m12abcde", "adb-emulator-5554", "adb-192.168.1.20:5555"]
    assert records[0] == {
        "hostname": "adb-r58m12abcde",
        "labels": ["board:phone", "lab:x"],
        "attributes": {"product": "beyond1lteeea", "model": "SM_G973F", "device": "beyond1", "transport_id": "3"},
    }


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("ABC/../x", "abc-.-x"), ("..hidden", "hidden"), ("a\u202eb\x07c", "a-b-c"), ("X" * 300, "x" * 255)],
)
def test_serials_are_cleaned_into_hostnames(raw, clean):
    assert clean_hostname(raw) == clean


def test_the_adb_source_runs_adb_from_path(tmp_path, monkeypatch, settings):
    settings.FLEETSHARD_DISCOVERY_LABELS = "board:phone"
    executable(tmp_path / "adb", f"#!/bin/sh\n[ \"$1 $2\" = 'devices -l' ] || exit 3\ncat <<'END'\n{ADB_OUTPUT}END\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    (source,) = parse_sources("adb")
    hosts, runs = run_sources([source])
    assert len(hosts) == 3 and runs["adb"]["ok"] and runs["adb"]["hosts"] == 3


def test_unknown_sources_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown source 'ftp:x'"):
        parse_sources("file:/x, ftp:x")
    assert [s.name for s in parse_sources(" file:/x ,command:/bin/y,adb,")] == ["file:/x", "command:/bin/y", "adb"]


def test_a_file_source_is_read_again_when_it_changes_and_garbage_keeps_the_last_good_set(tmp_path, caplog):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"hostname": "d1", "labels": ["board:a"]}]))
    sources = parse_sources(f"file:{path}")
    assert [h["hostname"] for h in run_sources(sources)[0]] == ["d1"]
    path.write_text(json.dumps([{"hostname": "d1"}, {"hostname": "d2", "attributes": {"k": "v"}}]))
    os.utime(path, (1, 1))
    assert [h["hostname"] for h in run_sources(sources)[0]] == ["d1", "d2"]
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="shard.sync.discovery"):
        hosts, runs = run_sources(sources)
    assert [h["hostname"] for h in hosts] == ["d1", "d2"]
    assert not runs[f"file:{path}"]["ok"] and "not JSON" in runs[f"file:{path}"]["error"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"discovery source file:{path} failed: not JSON") and "last good set (2 hosts)" in line
    path.unlink()
    assert [h["hostname"] for h in run_sources(sources)[0]] == ["d1", "d2"]


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ('echo \'{"hostname": "late"}\'; exit 1', "exited with status 1"),
        ("sleep 30", "still running after 0.5 s: killed"),
        ("echo 'garbage'", "line 1 is not JSON"),
        ("echo '[1, 2]'", "expected a host record"),
    ],
    ids=["fails", "hangs", "garbage", "not-a-record"],
)
def test_a_command_that_fails_hangs_or_prints_garbage_keeps_the_last_good_set(tmp_path, monkeypatch, script, error):
    monkeypatch.setattr(discovery, "COMMAND_TIMEOUT_S", 0.5)
    command = executable(tmp_path / "find-devices", '#!/bin/sh\necho \'{"hostname": "d1", "labels": ["x"]}\'\n')
    sources = parse_sources(f"command:{command}")
    assert run_sources(sources)[0] == [{"hostname": "d1", "labels": ["x"], "attributes": {}}]
    executable(command, f"#!/bin/sh\n{script}\n")
    hosts, runs = run_sources(sources)
    assert [h["hostname"] for h in hosts] == ["d1"]
    assert error in runs[f"command:{command}"]["error"]


def test_a_source_over_the_limit_fails(tmp_path, settings):
    settings.FLEETSHARD_MAX_DISCOVERED_HOSTS = 3
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"hostname": f"d{i}"} for i in range(4)]))
    hosts, runs = run_sources(parse_sources(f"file:{path}"))
    assert hosts == [] and "found more than FLEETSHARD_MAX_DISCOVERED_HOSTS=3 hosts" in runs[f"file:{path}"]["error"]


def test_the_set_gets_a_new_generation_only_when_it_changes_and_is_sent_until_acked(db):
    hosts = [{"hostname": "d1", "labels": ["board:a"], "attributes": {}}]
    assert record_set(hosts, {}) is True
    assert record_set(hosts, {}) is False
    sent = discovery_request()
    assert sent == {"discovered": {"generation": 1, "hosts": hosts}}
    note_ack(sent, None)  # the answer was lost: the same set goes again
    assert discovery_request() == sent
    note_ack(sent, DiscoveredAck(1, [Rejection("d9", "label x does not exist on the master")]))
    assert discovery_request() == {}
    assert DiscoveryState.objects.get().rejected == [
        {"hostname": "d9", "reason": "label x does not exist on the master"}
    ]


def test_a_master_ahead_of_this_database_gets_the_set_again_above_its_generation(db):
    record_set([{"hostname": "d1", "labels": [], "attributes": {}}], {})
    sent = discovery_request()
    note_ack(sent, DiscoveredAck(7, []))
    assert discovery_request()["discovered"]["generation"] == 8


def test_an_idle_host_that_leaves_the_set_is_missing_and_ready_when_back(world):
    world.host("d1", ("board:a",))
    world.host("d2", ("board:a",))
    both = [{"hostname": n, "labels": ["board:a"], "attributes": {}} for n in ("d1", "d2")]
    record_set(both, {})
    record_set(both[1:], {})
    assert dict(Host.objects.values_list("hostname", "status")) == {"d1": "Missing", "d2": "Ready"}
    record_set(both, {})
    assert dict(Host.objects.values_list("hostname", "status")) == {"d1": "Ready", "d2": "Ready"}


def test_a_run_on_a_host_that_leaves_the_set_is_stopped_as_an_infra_failure(world):
    host = world.host("d1", ("board:a",))
    record = [{"hostname": "d1", "labels": ["board:a"], "attributes": {}}]
    record_set(record, {})
    job = world.job("sleep 30", meta_host="board:a")
    world.run_until(lambda: world.hqe(job).status == "Running", what="the run to start")
    record_set([], {})
    world.run_until(lambda: world.hqe(job).status == "Failed", timeout=20, what="the run to stop")
    hqe = world.hqe(job)
    assert hqe.failure == "infra"
    assert (
        "the host left the discovered set: stopping the run" in (Path(world.results_dir(job)) / "job.log").read_text()
    )
    # Once the shard no longer tends it, the host is Missing again until the set holds it.
    world.run_until(lambda: world.idle(), what="the host to be let go")
    record_set([], {})
    assert world.host_status(host) == "Missing"


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"hostname": "d1", "labels": "board:a"}, "labels must be a list"),
        ({"hostname": "d1", "attributes": {"k": {"deep": [[[]]]}}}, "attribute 'k' must be a string"),
        ({"hostname": "d1", "attributes": {"k": "v" * 2000}}, "at most 1024 characters"),
        ({"hostname": "d1", "labels": ["x"] * 33}, "at most 32 labels"),
    ],
)
def test_a_record_the_master_would_refuse_whole_fails_its_source(tmp_path, record, error):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([record]))
    hosts, runs = run_sources(parse_sources(f"file:{path}"))
    assert hosts == [] and error in runs[f"file:{path}"]["error"]


def test_a_set_too_large_for_one_heartbeat_is_not_recorded(tmp_path, monkeypatch, db, caplog):
    monkeypatch.setattr(discovery, "MAX_SET_BYTES", 1000)
    record_set([{"hostname": "d0", "labels": [], "attributes": {}}], {})
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"hostname": f"d{i}", "attributes": {"k": "v" * 100}} for i in range(20)]))
    with caplog.at_level(logging.WARNING, logger="shard.sync.discovery"):
        hosts, runs = run_sources(parse_sources(f"file:{path}"))
    assert hosts is None and runs[f"file:{path}"]["ok"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"(file:{path} 20), more than 1000: keeping the set recorded before" in line, line
    assert record_set(hosts, runs) is False
    current = DiscoveryState.objects.get()
    assert [h["hostname"] for h in current.hosts] == ["d0"] and current.sources == runs


# Hostile sources: each fails alone, at once, naming itself, keeping its last good set, and nothing it
# does hangs the discovery thread, fills the memory or the disk, or breaks the shard's database.


def last_good_kept(tmp_path, source_spec, break_it):
    """Runs the source once with a good set, breaks it with `break_it()`, runs it again: the set kept,
    the run's error, and how long the failing run took."""
    sources = parse_sources(source_spec)
    assert [h["hostname"] for h in run_sources(sources)[0]] == ["good-1"]
    break_it()
    began = time.monotonic()
    hosts, runs = run_sources(sources)
    took = time.monotonic() - began
    assert [h["hostname"] for h in hosts] == ["good-1"], "the source's last good set is kept"
    assert not runs[source_spec]["ok"]
    return runs[source_spec]["error"], took


GOOD_RECORDS = json.dumps([{"hostname": "good-1", "labels": ["board:a"]}])


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda p: (p.unlink(), os.mkfifo(p)), "not a regular file"),
        (lambda p: (p.unlink(), p.symlink_to("/dev/zero")), "not a regular file"),
        (lambda p: (p.unlink(), p.mkdir()), "not a regular file"),
        (lambda p: (p.unlink(), p.symlink_to(p)), "cannot read it: Too many levels of symbolic links"),
        (lambda p: p.unlink(), "cannot read it: No such file or directory"),
        (lambda p: os.truncate(p, 32 * 1024 * 1024 + 1), f"{32 * 1024 * 1024 + 1} bytes, more than {32 * 1024 * 1024}"),
    ],
    ids=["fifo", "symlink-to-dev-zero", "directory", "symlink-loop", "deleted", "huge"],
)
def test_a_file_source_that_is_no_regular_file_or_too_large_fails_at_once(tmp_path, make, error):
    path = tmp_path / "hosts.json"
    path.write_text(GOOD_RECORDS)
    message, took = last_good_kept(tmp_path, f"file:{path}", lambda: make(path))
    assert error in message and took < 5, (message, took)


def test_a_file_source_is_never_read_past_the_limit_even_when_it_grows_while_read(monkeypatch):
    # A regular file whose size says 0 but whose read goes on: /proc's files are, as is any file
    # appended to between the size check and the read.
    monkeypatch.setattr(discovery, "MAX_SOURCE_BYTES", 64)
    source = discovery.FileSource(Path("/proc/self/status"))
    with pytest.raises(discovery.SourceFailed, match="grew past 64 bytes while read"):
        source()


def test_a_file_replaced_by_one_of_the_same_size_and_time_is_read_again(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text(GOOD_RECORDS)
    source = discovery.FileSource(path)
    assert [h["hostname"] for h in source()] == ["good-1"]
    st = path.stat()
    other = tmp_path / "new.json"
    other.write_text(GOOD_RECORDS.replace("good-1", "good-2"))
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    other.replace(path)  # as `cp -p`, rsync -t or a configuration tool's atomic rename would
    assert [h["hostname"] for h in source()] == ["good-2"]


def command(tmp_path, body):
    return executable(tmp_path / "find-devices", f"#!/bin/sh\n{body}\n")


GOOD_LINE = """echo '{"hostname": "good-1", "labels": ["board:a"]}'"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("body", "error", "most_s"),
    [
        ('yes \'{"hostname": "x"}\'', f"printed more than {32 * 1024 * 1024} bytes: killed", 15),
        ("head -c 3000000000 /dev/zero", f"printed more than {32 * 1024 * 1024} bytes: killed", 15),
        ("kill -9 $$", "killed by signal SIGKILL", 5),
        ("echo 'bad things' >&2; exit 3", "exited with status 3: bad things", 5),
        ('printf \'{"hostname": "d\\377"}\\n\'', "line 1 is not UTF-8 text", 5),
        ("printf '\\000\\001\\002binary\\n'", "line 1 is not JSON", 5),
    ],
    ids=["prints-forever", "prints-gigabytes", "killed", "exits-non-zero", "invalid-utf-8", "binary"],
)
def test_a_command_source_that_floods_is_killed_or_prints_garbage_fails_alone(
    tmp_path, monkeypatch, body, error, most_s
):
    monkeypatch.setattr(discovery, "COMMAND_TIMEOUT_S", 30.0)
    script = command(tmp_path, GOOD_LINE)
    message, took = last_good_kept(tmp_path, f"command:{script}", lambda: command(tmp_path, body))
    assert message.startswith(error) and took < most_s, (message, took)


@pytest.mark.timeout(60)
def test_a_command_flooding_its_standard_error_is_kept_to_its_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(discovery, "COMMAND_TIMEOUT_S", 2.0)
    script = command(tmp_path, GOOD_LINE)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    message, took = last_good_kept(tmp_path, f"command:{script}", lambda: command(tmp_path, "yes error >&2"))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert message == "still running after 2 s: killed" and took < 8, (message, took)
    assert grown_mib < 64, f"the process's peak memory grew by {grown_mib:.0f} MiB"


@pytest.mark.timeout(60)
def test_what_a_command_leaves_holding_its_output_makes_no_run_wait_past_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(discovery, "COMMAND_TIMEOUT_S", 1.0)
    script = command(tmp_path, GOOD_LINE)
    pid_file = tmp_path / "pid"
    # A child in a session of its own escapes the kill of the command's process group.
    leave = f"setsid sleep 120 & echo $! > {pid_file}; {GOOD_LINE}"
    try:
        message, took = last_good_kept(tmp_path, f"command:{script}", lambda: command(tmp_path, leave))
    finally:
        wait_until(pid_file.exists, what="the child's pid")
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert message == "exited, but what it started still held its output open after 1 s: killed", message
    assert took < 5, took


@pytest.mark.parametrize(
    "record",
    [
        {"hostname": "d\u0000"},
        {"hostname": "d\ud800"},
        {"hostname": "d1", "labels": ["board\u0000"]},
        {"hostname": "d1", "attributes": {"k": "v\u0000"}},
        {"hostname": "d1", "attributes": {"k\ud800": "v"}},
    ],
    ids=["nul-hostname", "surrogate-hostname", "nul-label", "nul-attribute", "surrogate-attribute-name"],
)
def test_a_record_no_database_can_store_fails_its_source_and_the_set_is_still_recorded(tmp_path, db, record):
    path, other = tmp_path / "hosts.json", tmp_path / "other.json"
    path.write_text(GOOD_RECORDS)
    spec = f"file:{path}"
    message, _ = last_good_kept(tmp_path, spec, lambda: path.write_text(json.dumps([record])))
    assert message.startswith("item 0: ") and "holds NUL or a lone surrogate, which no database stores" in message
    # Before, such a record reached the shard's database, whose jsonb (PostgreSQL) refused it: every
    # later run of every source failed, in a log line naming none.
    other.write_text(json.dumps([{"hostname": "other-1", "labels": ["board:a"]}]))
    assert record_set(*run_sources(parse_sources(f"{spec},file:{other}"))) is True
    current = DiscoveryState.objects.get()
    assert [h["hostname"] for h in current.hosts] == ["other-1"] and not current.sources[spec]["ok"]


@pytest.mark.timeout(60)
def test_100000_hosts_from_one_source_fail_it_quickly_keeping_its_last_good_set(tmp_path):
    script = command(tmp_path, GOOD_LINE)
    lines = tmp_path / "lines"
    lines.write_text("".join(f'{{"hostname": "d{i}"}}\n' for i in range(100_000)))
    message, took = last_good_kept(tmp_path, f"command:{script}", lambda: command(tmp_path, f"cat {lines}"))
    assert message == "found more than FLEETSHARD_MAX_DISCOVERED_HOSTS=10000 hosts" and took < 10, (message, took)


def test_sources_that_find_more_than_the_limit_together_keep_the_recorded_set(tmp_path, settings, db, caplog):
    settings.FLEETSHARD_MAX_DISCOVERED_HOSTS = 10
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([{"hostname": f"a{i}"} for i in range(6)]))
    second.write_text(json.dumps([{"hostname": f"b{i}"} for i in range(3)]))
    sources = parse_sources(f"file:{first},file:{second}")
    assert record_set(*run_sources(sources)) is True
    second.write_text(json.dumps([{"hostname": f"b{i}"} for i in range(6)]))
    with caplog.at_level(logging.WARNING, logger="shard.sync.discovery"):
        hosts, runs = run_sources(sources)
    assert hosts is None and all(run["ok"] for run in runs.values())
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"found 12 hosts together (file:{first} 6, file:{second} 6)" in line
    assert "more than FLEETSHARD_MAX_DISCOVERED_HOSTS=10: keeping the set recorded before" in line
    assert record_set(hosts, runs) is False
    assert len(DiscoveryState.objects.get().hosts) == 9 and DiscoveryState.objects.get().generation == 1


def test_adb_output_with_odd_lines_registers_only_what_is_a_device_online():
    odd = (
        "adb server version (41) doesn't match this client (39); killing...\r\n"
        "* daemon started successfully\r\n"
        "List of devices attached\r\n"
        "????????????\tno permissions (user in plugdev group; are your udev rules wrong?); see [http://x]\r\n"
        "R58M\tdevice usb:1-1 model:Pixel\x00\x1b[31m product:p extra:ignored model\r\n"
        "r58m\tdevice model:other\r\n"
        "0123/..\u202eevil\tdevice transport_id:9\r\n"
        "emulator-5556\tbootloader\r\n"
        "emulator-5558\trecovery\r\n"
        "emulator-5560\tsideload\r\n"
        "lonely-serial\r\n"
        "\tdevice\r\n"
        "device\r\n"
    )
    records = parse_adb_devices(odd)
    assert records == [
        {"hostname": "adb-r58m", "labels": [], "attributes": {"model": "Pixel??[31m", "product": "p"}},
        {"hostname": "adb-0123-.-evil", "labels": [], "attributes": {"transport_id": "9"}},
    ]


def test_hostnames_differing_only_in_case_are_one_device_the_first_sources_record_kept(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([{"hostname": "Pixel-1", "labels": ["board:a"]}, {"hostname": "PIXEL-1"}]))
    second.write_text(json.dumps([{"hostname": "pixel-1", "labels": ["board:b"]}, {"hostname": "Pixel-2"}]))
    hosts, _ = run_sources(parse_sources(f"file:{first},file:{second}"))
    assert hosts == [
        {"hostname": "pixel-1", "labels": ["board:a"], "attributes": {}},
        {"hostname": "pixel-2", "labels": [], "attributes": {}},
    ]


def test_a_device_flapping_at_every_run_makes_one_generation_per_run_and_its_host_follows(world):
    host = world.host("d1", ("board:a",))
    present = [{"hostname": "d1", "labels": ["board:a"], "attributes": {}}]
    for run in range(1, 11):
        assert record_set(present if run % 2 else [], {}) is True
        assert DiscoveryState.objects.get().generation == run
        assert world.host_status(host) == ("Ready" if run % 2 else "Missing")
    sent = discovery_request()
    assert sent["discovered"] == {"generation": 10, "hosts": []}, "only the latest set is sent"
