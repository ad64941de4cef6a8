"""The rules on what the master accepts (findings A, D, E, G of the input review): names, meta-host
counts, a job's size, distinct hosts per job, and the token's last use."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.errors import FleetshardError, NotFound, Refused
from common.models import Host, HostQueueEntry, Job, Label, Shard
from common.syntax import parse_meta_hosts, parse_priority
from master import services
from master.access.credentials import TOUCH_INTERVAL, touch
from master.models import Token
from tests.fleet_state import snapshot
from tests.support import assert_status

NAME_RULE = "use letters, digits and . - _ : @ + = (no '..', not starting with '.', at most 255 characters)"
BAD_NAMES = [
    "a/b",
    "..",
    "../../etc",
    "a..b",
    ".hidden",
    "a\x01b",
    "a\u202eb",
    "dut\n",
    "é",
    "a b",
    "a,b",
    "a*2",
    "x" * 256,
    "",
]


# D. Names


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_for_hosts_labels_and_shards(fleet, name):
    before = snapshot()
    for kind, create in [
        ("host", lambda: services.create_hosts([name], acting_user=None)),
        ("label", lambda: services.create_labels([name], acting_user=None)),
        ("shard", lambda: services.create_shard(name, acting_user=None)),
    ]:
        with pytest.raises(FleetshardError) as exc:
            create()
        assert exc.value.message == f"invalid {kind} name {name!r}: {NAME_RULE}"
    assert snapshot() == before


def test_names_may_use_the_allowed_characters(fleet):
    name = "dut-1.lab_2:x@y+z=w"
    services.create_labels([name], acting_user=None)
    services.create_shard(name, [name], acting_user=None)
    assert services.create_hosts([name], labels=[name], acting_user=None)[0].shard.hostname == name
    assert services.create_labels(["x" * 255], acting_user=None)[0].name == "x" * 255


def test_objects_named_before_the_rule_can_still_be_changed_and_deleted(fleet):
    Host.objects.create(hostname="old host/1")
    Label.objects.create(name="old label")
    services.add_label_to_hosts("old label", ["old host/1"], acting_user=None)
    services.lock_hosts(["old host/1"], "legacy", acting_user=None)
    services.delete_labels(["old label"], acting_user=None)
    services.delete_hosts(["old host/1"], acting_user=None)
    assert not Host.objects.filter(hostname="old host/1").exists()


def test_a_nul_in_a_name_to_look_up_is_unknown(fleet):
    with pytest.raises(NotFound, match="unknown host 'a\\\\x00'"):
        services.lock_hosts(["a\x00"], acting_user=None)


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"a b": "1"}, "invalid attribute name 'a b'"),
        ({"serial\n": "1"}, "invalid attribute name 'serial\\n'"),
        ({"a\x00": "1"}, "invalid attribute name 'a\\x00'"),
        ({"serial": "X\x00"}, "attribute serial must not contain NUL"),
        ({"serial": "x" * 1025}, "attribute serial is longer than 1024 characters"),
        ({f"k{i}": "v" for i in range(257)}, "attributes may have at most 256 entries; this one has 257"),
    ],
)
def test_bad_attributes_are_refused(fleet, attributes, message):
    with pytest.raises(FleetshardError, match="^" + message.replace("\\", "\\\\").replace("(", "\\(")):
        services.create_hosts(["new"], attributes=attributes, acting_user=None)
    assert not Host.objects.filter(hostname="new").exists()


@pytest.mark.parametrize(
    "keyvals, message",
    [
        ({"a=b": "1"}, "invalid keyval name 'a=b'"),
        ({"": "1"}, "invalid keyval name ''"),
        ({"a\x00": "1"}, "invalid keyval name 'a\\x00'"),
        ({"build": "\ud800"}, "keyval build must not contain NUL or lone surrogate"),
        ({"build": {"nested": "x"}}, "keyval build must be a string, not dict"),
    ],
)
def test_bad_keyvals_are_refused(fleet, keyvals, message):
    with pytest.raises(FleetshardError) as exc:
        fleet.job(keyvals=keyvals)
    assert exc.value.message.startswith(message) and exc.value.field == "keyvals"
    assert not Job.objects.exists()


@pytest.mark.parametrize("item", ["board:a*1_0", "board:a*٣", "board:a*+3", "board:a* 3", "board:a*", "board:a*-1",
                                  "board:a*3.0", "board:a*²", "board:a*0x3"])  # fmt: skip
def test_meta_host_counts_are_plain_ascii_digits(item):
    with pytest.raises(FleetshardError, match=r"the count after '\*' must be a whole number in ASCII digits"):
        parse_meta_hosts(item)


def test_a_meta_host_needs_a_label():
    with pytest.raises(FleetshardError, match=r"^invalid meta-host '\*3': it needs a label before '\*'$"):
        parse_meta_hosts("board:a,*3")


def test_meta_host_counts(fleet):
    assert parse_meta_hosts("board:a*3, wifi,board:b*010") == [("board:a", 3), ("wifi", 1), ("board:b", 10)]
    with pytest.raises(FleetshardError, match="must be at least 1"):
        fleet.job(meta_hosts=parse_meta_hosts("board:a*0"))


@pytest.mark.parametrize("priority", ["²", "٣", "1_0", "１", "1e3", "0x10", "9" * 5000, True, 2**31])
def test_priorities_are_ascii_integers_in_range_or_names(priority):
    with pytest.raises(FleetshardError, match="invalid priority"):
        parse_priority(priority)
    assert (parse_priority(" +7 "), parse_priority("-3"), parse_priority("High")) == (7, -3, 70)


@pytest.mark.parametrize("priority", ["high", True, 2**31, 1.5])
def test_the_job_service_takes_only_an_int32_priority(fleet, priority):
    with pytest.raises(FleetshardError, match="invalid priority .*: it must be an integer between"):
        fleet.job(priority=priority)
    assert not Job.objects.exists()
    assert fleet.job(priority=-7).priority == -7


# A. A job's size


def test_a_job_may_not_ask_for_more_hqes_than_the_bound(fleet):
    with pytest.raises(FleetshardError) as exc:
        fleet.job(meta_hosts=[("board:a", 100000)])
    assert exc.value.message == "a job may have at most 500 host queue entries; this one asks for 100000"
    with pytest.raises(FleetshardError, match="at most 500 host queue entries; this one asks for 10{100}$"):
        fleet.job(meta_hosts=parse_meta_hosts("board:a*" + "9" * 5000))
    with pytest.raises(FleetshardError, match="this one asks for 501"):
        fleet.job(meta_hosts=[("board:a", 250), ("board:a", 250), ("wifi", 1)])
    assert not Job.objects.exists() and not HostQueueEntry.objects.exists()


def test_a_command_too_long_to_exec_is_refused(fleet):
    """`/bin/sh -c COMMAND` cannot exec a COMMAND over Linux's 128 KiB argument limit (E2BIG): such a
    job used to be accepted and then fail on every shard as an infra failure, sending its host to repair."""

    def job(command: str) -> Job:
        return services.create_job(
            services.JobRequest(name="big", owner="ana", command=command, hosts=["a1"]), acting_user=None
        )

    with pytest.raises(FleetshardError, match="at most 131071 bytes") as exc:
        job("true #" + "é" * 70000)
    assert exc.value.field == "command"
    assert not Job.objects.exists()
    job("true #" + "x" * (131071 - 6))


def test_the_bound_is_a_setting(fleet, settings):
    settings.FLEETSHARD_MAX_HQES_PER_JOB = 2
    with pytest.raises(FleetshardError, match="^a job may have at most 2 host queue entries; this one asks for 3$"):
        fleet.job(meta_hosts=[("board:a", 3)])
    with pytest.raises(FleetshardError, match="this one asks for 3$") as exc:
        fleet.job(meta_hosts=[], hosts=["a1", "a2", "a3", "a1"])
    assert exc.value.field == "hosts"
    assert fleet.job(meta_hosts=[("board:a", 2)]).hqes.count() == 2
    assert fleet.job(meta_hosts=[], hosts=["a1", "a2", "a1"]).hqes.count() == 2


def test_the_setting_reads_the_environment():
    import subprocess
    import sys

    from tests.support import ROOT

    code = (
        "import django; django.setup(); from django.conf import settings; print(settings.FLEETSHARD_MAX_HQES_PER_JOB)"
    )
    env = {"DJANGO_SETTINGS_MODULE": "server.settings", "FLEETSHARD_MAX_HQES_PER_JOB": "7", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "7"


# B. A label named twice


def test_a_label_named_twice_is_merged(fleet):
    job = fleet.job(meta_hosts=[("board:a", 1), ("board:a", 1), ("wifi", 1)])
    assert sorted(h.meta_host.name for h in job.hqes.all()) == ["board:a", "board:a", "wifi"]
    with pytest.raises(Refused, match="job asks for 4 hosts with board:a but shard lab1 has 3"):
        fleet.job(meta_hosts=[("board:a", 2), ("wifi", 1), ("board:a", 2)])


# G. A job never uses a host twice


def test_a_meta_host_asking_for_more_hosts_than_the_shard_has_is_refused(fleet):
    before = snapshot()
    with pytest.raises(Refused) as exc:
        fleet.job(meta_hosts=[("board:a", 4)])
    assert exc.value.message == "job asks for 4 hosts with board:a but shard lab1 has 3"
    with pytest.raises(Refused) as exc:
        fleet.job(meta_hosts=[("board:a", 3)], dependency_labels=["wifi"])
    assert exc.value.message == "job asks for 3 hosts with board:a (and dependency labels wifi) but shard lab1 has 2"
    assert snapshot() == before
    assert fleet.job(meta_hosts=[("board:a", 2)], dependency_labels=["wifi"]).hqes.count() == 2


def test_locked_hosts_count_as_hosts(fleet):
    services.lock_hosts(["a1", "a2", "a3"], "maintenance", acting_user=None)
    assert fleet.job(meta_hosts=[("board:a", 3)]).hqes.count() == 3


def test_only_hosts_of_the_jobs_shard_count(fleet):
    # wifi is on a1, a2 (lab1) and b1 (lab2); the job goes to lab1, where two hosts have it.
    with pytest.raises(
        Refused, match="job asks for 3 hosts with wifi .and dependency labels board:a. but shard lab1 has 2"
    ):
        fleet.job(meta_hosts=[("wifi", 3)], dependency_labels=["board:a"])


def test_meta_hosts_together_need_as_many_different_hosts_as_entries(fleet):
    # lab1: a1 and a2 have board:a and wifi, a3 only board:a. Each label alone has enough hosts,
    # but board:a*2 and wifi*2 need four different hosts and lab1 has three.
    with pytest.raises(Refused) as exc:
        fleet.job(meta_hosts=[("board:a", 2), ("wifi", 2)])
    assert exc.value.message == (
        "job asks for 4 different hosts with board:a or wifi but shard lab1 has 3 (a job never uses a host twice)"
    )
    # board:a*1 on a3 and wifi*2 on a1, a2: three different hosts, which lab1 has.
    assert fleet.job(meta_hosts=[("board:a", 1), ("wifi", 2)]).hqes.count() == 3


def test_the_whole_job_check_finds_labels_competing_for_the_same_hosts(db):
    # Two labels only host h1 has, and a third on plenty of hosts: six hosts for three entries,
    # each label with a host, yet x and y both need h1.
    services.create_labels(["board:z", "x", "y"], acting_user=None)
    services.create_shard("lab", ["board:z"], acting_user=None)
    services.create_hosts(["h1"], labels=["board:z", "x", "y"], acting_user=None)
    services.create_hosts([f"h{i}" for i in range(2, 7)], labels=["board:z"], acting_user=None)
    request = dict(name="j", owner="ana", command="true", dependency_labels=["board:z"])
    with pytest.raises(Refused) as exc:
        services.create_job(
            services.JobRequest(meta_hosts=[("x", 1), ("y", 1), ("board:z", 1)], **request), acting_user=None
        )
    assert exc.value.message == (
        "job asks for 2 different hosts with x or y (and dependency labels board:z) but shard lab has 1 "
        "(a job never uses a host twice)"
    )
    assert not Job.objects.exists()
    assert (
        services.create_job(
            services.JobRequest(meta_hosts=[("x", 1), ("board:z", 5)], **request), acting_user=None
        ).hqes.count()
        == 6
    )


def test_the_capacity_check_costs_a_fixed_number_of_queries(fleet):
    services.create_hosts([f"extra{i}" for i in range(40)], labels=["board:a", "wifi"], acting_user=None)
    with CaptureQueriesContext(connection) as small:
        fleet.job("small", meta_hosts=[("board:a", 1)])
    with CaptureQueriesContext(connection) as large:
        fleet.job("large", meta_hosts=[("board:a", 20), ("wifi", 20)])
    assert len(large.captured_queries) <= len(small.captured_queries) + 2


# E. Token.last_used


def test_touch_writes_at_most_once_in_its_interval(db):
    token, _ = services.create_personal_token("ana", acting_user=None)
    now = timezone.now()
    assert touch(token, now) is True
    assert Token.objects.get(id=token.id).last_used == now
    stale = Token.objects.get(id=token.id)  # another process's copy, loaded before the next write
    with CaptureQueriesContext(connection) as ctx:
        assert touch(token, now + TOUCH_INTERVAL - timedelta(seconds=1)) is False
    assert ctx.captured_queries == []  # the loaded row shows a recent use: no query at all
    later = now + TOUCH_INTERVAL + timedelta(seconds=1)
    assert touch(token, later) is True
    stale.last_used = None  # as if its copy predated every write: the UPDATE's WHERE still says no
    assert touch(stale, later + timedelta(seconds=1)) is False
    assert Token.objects.get(id=token.id).last_used == later


def test_the_rest_api_records_a_tokens_last_use(fleet, client):
    token, raw = services.create_personal_token("ana", acting_user=None)
    assert token.last_used is None
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert_status(client.get("/api/v1/labels/", **headers), 200)
    first = Token.objects.get(id=token.id).last_used
    assert first is not None and timezone.now() - first < timedelta(seconds=10)
    with CaptureQueriesContext(connection) as ctx:
        assert_status(client.get("/api/v1/labels/", **headers), 200)
    assert not [q for q in ctx.captured_queries if q["sql"].upper().startswith("UPDATE")]
    assert Token.objects.get(id=token.id).last_used == first
    Token.objects.filter(id=token.id).update(last_used=first - timedelta(minutes=5))
    assert_status(client.get("/api/v1/labels/", **headers), 200)
    assert Token.objects.get(id=token.id).last_used > first


def test_shards_and_refused_tokens_are_not_touched_by_the_rest_api(fleet, client):
    client.get("/api/v1/labels/", HTTP_AUTHORIZATION=f"Bearer {fleet.token1}")
    assert Token.objects.get(shard=fleet.lab1).last_used is None
    assert Shard.objects.count() == 2
