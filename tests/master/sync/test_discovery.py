"""The master's side of discovery (docs/design.md, "Capacity that registers itself"): a shard's whole
discovered set, applied once per generation, every refused record with its reason."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.errors import Refused
from common.models import Host, HostQueueEntry, Shard
from master import services
from master.models import AuditRecord


def dev(name, labels=("board:a",), **attributes):
    return {"hostname": name, "labels": list(labels), "attributes": attributes}


def discover(heartbeat, fleet, generation, hosts, **kwargs):
    return heartbeat(fleet.lab1, fleet.token1, discovered={"generation": generation, "hosts": hosts}, **kwargs)


def test_a_discovered_set_creates_hosts_of_the_shard_sent_in_the_same_answer(fleet, heartbeat):
    resp = discover(heartbeat, fleet, 1, [dev("adb-r58m", serial="R58M"), dev("adb-x1", ("board:a", "wifi"))])
    assert resp["discovered_ack"] == {"generation": 1, "rejected": []}
    made = Host.objects.get(hostname="adb-r58m")
    assert (made.origin, made.discovered_by, made.shard, made.status) == ("discovered", fleet.lab1, fleet.lab1, "Ready")
    assert made.attributes == {"serial": "R58M"} and made.last_seen is not None
    assert sorted(Host.objects.get(hostname="adb-x1").labels.values_list("name", flat=True)) == ["board:a", "wifi"]
    assert {"adb-r58m", "adb-x1"} <= {h["hostname"] for h in resp["hosts"]}
    (audit,) = AuditRecord.objects.filter(action="host.discover")
    assert audit.actor == "shard:lab1" and audit.details["created"] == 2


def test_each_refused_record_says_why_and_touches_nothing(fleet, heartbeat):
    before = list(Host.objects.order_by("id").values())
    hosts = [
        dev("ok-1"),
        dev("x1", ("board:nope",)),
        dev("x2", ("board:b",)),
        dev("x3", ("wifi",)),
        dev("b1"),
        dev("c1"),
        dev("a/b"),
        dev("..up"),
        dev("bell\x07"),
        dev("evil\u202egnp"),
        dev("ok-1"),
        "not a record",
        {"hostname": "x4", "labels": ["board:a"], "attributes": {"k": 1}},
        {"hostname": "x5", "labels": "board:a"},
    ]
    resp = discover(heartbeat, fleet, 1, hosts)
    reasons = {r["hostname"]: r["reason"] for r in resp["discovered_ack"]["rejected"]}
    assert reasons["x1"] == "label board:nope does not exist on the master"
    assert reasons["x2"] == "label board:b belongs to shard lab2, not lab1"
    assert reasons["x3"] == "none of its labels belongs to shard lab1, so it could not be its host"
    assert reasons["b1"] == "hostname b1 is a host of shard lab2"
    assert reasons["c1"] == "hostname c1 is a host of no shard"
    assert reasons["a/b"].startswith("invalid hostname") and reasons["..up"].startswith("invalid hostname")
    assert reasons["bell\\u0007"].startswith("invalid hostname")
    assert reasons["evil\\u202egnp"].startswith("invalid hostname")
    assert "twice" in reasons["ok-1"]
    assert "must be an object" in reasons["not a record"]
    assert "attribute k must be a string" in reasons["x4"] and "labels must be a list" in reasons["x5"]
    assert len(resp["discovered_ack"]["rejected"]) == 13
    assert list(Host.objects.exclude(hostname="ok-1").order_by("id").values()) == before
    assert Shard.objects.get(id=fleet.lab1.id).discovered_rejected == resp["discovered_ack"]["rejected"]


def test_a_declared_host_of_the_shard_is_matched_not_duplicated(fleet, heartbeat):
    discover(heartbeat, fleet, 1, [dev("a1", ("board:a",), serial="S1")])
    a1 = Host.objects.get(hostname="a1")
    assert (a1.origin, a1.discovered_by_id) == ("declared", fleet.lab1.id)
    assert a1.attributes == {"serial": "S1"} and a1.version == 2
    # People own a declared host's labels: discovery leaves them.
    assert sorted(a1.labels.values_list("name", flat=True)) == ["board:a", "wifi"]
    assert Host.objects.filter(hostname="a1").count() == 1


def test_a_generation_is_applied_once_and_an_older_one_changes_nothing(fleet, heartbeat):
    first = discover(heartbeat, fleet, 5, [dev("d1"), dev("d2", ("board:b",))])
    seen = list(Host.objects.order_by("id").values())
    # The answer was lost: the shard sends the same generation again (and later an older one).
    again = discover(heartbeat, fleet, 5, [dev("d1"), dev("d2", ("board:b",))])
    older = discover(heartbeat, fleet, 3, [dev("zz")])
    assert again["discovered_ack"] == first["discovered_ack"] == older["discovered_ack"]
    assert older["discovered_ack"]["generation"] == 5
    assert list(Host.objects.order_by("id").values()) == seen
    assert AuditRecord.objects.filter(action="host.discover").count() == 1


def running_on(fleet, heartbeat, hostname):
    job = fleet.job(hosts=[hostname], meta_hosts=[])
    hqe = job.hqes.get()
    host = Host.objects.get(hostname=hostname)
    resp = heartbeat(
        fleet.lab1,
        fleet.token1,
        updates=[{"seq": 1, "hqe": hqe.id, "job": job.id, "status": "Running", "host": host.id}],
    )
    assert resp["acks"][0]["result"] == "accepted"
    return hqe


def test_a_device_that_leaves_goes_missing_its_run_fails_as_infra_and_it_comes_back_through_cleaning(fleet, heartbeat):
    discover(heartbeat, fleet, 1, [dev("d1"), dev("d2")])
    hqe = running_on(fleet, heartbeat, "d1")
    resp = discover(heartbeat, fleet, 2, [dev("d2")])
    assert resp["discovered_ack"] == {"generation": 2, "rejected": []}
    assert Host.objects.get(hostname="d1").status == "Missing"
    hqe = HostQueueEntry.objects.get(id=hqe.id)
    assert (hqe.status, hqe.failure) == ("Failed", "infra")
    assert "host d1 vanished from shard lab1's discovered set" in hqe.log_tail
    assert hqe.job.status == "Failed"
    discover(heartbeat, fleet, 3, [dev("d1"), dev("d2")])
    assert Host.objects.get(hostname="d1").status == "Cleaning"
    audit = AuditRecord.objects.filter(action="host.discover").order_by("id")
    assert [a.details["missing"] for a in audit] == [0, 1, 0] and audit.last().details["back"] == 1


def test_a_missing_host_is_forgotten_after_the_configured_days_keeping_its_history(fleet, heartbeat, settings):
    settings.FLEETSHARD_DISCOVERED_FORGET_DAYS = 2
    discover(heartbeat, fleet, 1, [dev("d1"), dev("d2")])
    hqe = running_on(fleet, heartbeat, "d1")
    discover(heartbeat, fleet, 2, [dev("d2")])
    Host.objects.filter(hostname="d1").update(last_seen=timezone.now() - timedelta(days=3))
    discover(heartbeat, fleet, 3, [dev("d2"), dev("d3")])
    assert not Host.objects.filter(hostname="d1").exists()
    assert HostQueueEntry.objects.get(id=hqe.id).status == "Failed"


def test_a_set_over_the_limit_is_refused_whole(fleet, heartbeat, settings):
    discover(heartbeat, fleet, 1, [dev("d1")])
    before = list(Host.objects.order_by("id").values())
    resp = discover(heartbeat, fleet, 2, [dev(f"h{i}") for i in range(100_000)])
    (rejected,) = resp["discovered_ack"]["rejected"]
    assert rejected["hostname"] == "*"
    assert "the set has 100000 hosts; a shard may discover at most 10000" in rejected["reason"]
    assert list(Host.objects.order_by("id").values()) == before


def test_rejections_are_bounded(fleet, heartbeat):
    resp = discover(heartbeat, fleet, 1, [dev(f"x{i}", ("nope",)) for i in range(1000)])
    rejected = resp["discovered_ack"]["rejected"]
    assert len(rejected) == 200 and rejected[-1] == {"hostname": "*", "reason": "801 more hosts were refused"}


@pytest.mark.parametrize(
    "discovered",
    [[], {"generation": 0, "hosts": []}, {"generation": True, "hosts": []}, {"generation": 1, "hosts": {}}, "x"],
)
def test_a_malformed_envelope_is_a_400_changing_nothing(fleet, heartbeat, discovered):
    resp = heartbeat(fleet.lab1, fleet.token1, expect=400, discovered=discovered)
    assert resp["detail"]["field"].startswith("discovered")
    assert not Host.objects.filter(origin="discovered").exists()


def test_pools_are_stored_whole(fleet, heartbeat):
    heartbeat(fleet.lab1, fleet.token1, pools=[{"labels": ["board:a"], "max_hosts": 6}])
    assert Shard.objects.get(id=fleet.lab1.id).pools == [{"labels": ["board:a"], "max_hosts": 6}]
    resp = heartbeat(fleet.lab1, fleet.token1, expect=400, pools=[{"labels": [], "max_hosts": 6}])
    assert resp["detail"]["field"] == "pools[0].labels"


# Bounded queries: a set's cost does not grow with its hosts. Pinned exactly per database: SQLite and
# PostgreSQL differ only by the heartbeat's own statements.
APPLY_NEW = {"postgresql": 26, "sqlite": 26}
# Three of them write the `host.missing` notification of the host that left (master/notify/events.py).
APPLY_CHANGED = {"postgresql": 24, "sqlite": 24}


@pytest.mark.parametrize("size", [10, 10_000])
def test_a_set_is_applied_in_a_fixed_number_of_queries_whatever_its_size(fleet, heartbeat, size):
    hosts = [dev(f"dev-{i:05d}", serial=str(i)) for i in range(size)]
    with CaptureQueriesContext(connection) as first:
        resp = discover(heartbeat, fleet, 1, hosts)
    assert resp["discovered_ack"] == {"generation": 1, "rejected": []}
    assert Host.objects.filter(discovered_by=fleet.lab1, origin="discovered").count() == size
    assert len(first) == APPLY_NEW[connection.vendor], "\n".join(q["sql"][:150] for q in first)
    # 1% changed, one host gone.
    hosts = [dev(f"dev-{i:05d}", serial=str(i) + ("x" if i % 100 == 1 else "")) for i in range(1, size)]
    with CaptureQueriesContext(connection) as second:
        discover(heartbeat, fleet, 2, hosts, known_hosts=[])
    assert len(second) == APPLY_CHANGED[connection.vendor], "\n".join(q["sql"][:150] for q in second)
    assert Host.objects.get(hostname="dev-00000").status == "Missing"
    assert Host.objects.get(hostname="dev-00001").attributes == {"serial": "1x"}
    assert Host.objects.filter(discovered_by=fleet.lab1, version=2).count() == len(range(1, size, 100))


def test_a_device_flapping_every_generation_is_bounded_to_one_change_and_one_record_each(fleet, heartbeat):
    discover(heartbeat, fleet, 1, [dev("d1"), dev("d2")])
    before = list(Host.objects.exclude(hostname__in=["d1", "d2"]).order_by("id").values())
    for generation in range(2, 22):
        hosts = [dev("d2")] if generation % 2 == 0 else [dev("d1"), dev("d2")]
        resp = discover(heartbeat, fleet, generation, hosts)
        assert resp["discovered_ack"] == {"generation": generation, "rejected": []}
        assert Host.objects.get(hostname="d1").status == ("Missing" if generation % 2 == 0 else "Cleaning")
    assert Host.objects.filter(hostname="d1").count() == 1
    assert AuditRecord.objects.filter(action="host.discover").count() == 21
    assert list(Host.objects.exclude(hostname__in=["d1", "d2"]).order_by("id").values()) == before


def test_a_host_of_another_shard_keeps_everything_when_a_shard_claims_its_name(fleet, heartbeat):
    b1 = Host.objects.filter(hostname="b1").values().get()
    resp = discover(heartbeat, fleet, 1, [dev("b1", serial="stolen")])
    assert resp["discovered_ack"]["rejected"] == [{"hostname": "b1", "reason": "hostname b1 is a host of shard lab2"}]
    assert Host.objects.filter(hostname="b1").values().get() == b1
    assert not AuditRecord.objects.filter(action="host.discover").exists()


def test_a_pool_with_no_host_yet_accepts_jobs_up_to_its_max_hosts(fleet, heartbeat):
    services.create_labels(["pool:gpu"], acting_user=None)
    services.add_labels_to_shard("lab1", ["pool:gpu"], acting_user=None)
    with pytest.raises(Refused, match="no shard can serve this job: no host has label pool:gpu"):
        fleet.job(meta_hosts=[("pool:gpu", 1)])
    heartbeat(fleet.lab1, fleet.token1, pools=[{"labels": ["pool:gpu"], "max_hosts": 6}])
    job = fleet.job(meta_hosts=[("pool:gpu", 6)])
    assert job.shard == fleet.lab1
    with pytest.raises(Refused, match="job asks for 7 hosts with pool:gpu but shard lab1 has 6"):
        fleet.job(meta_hosts=[("pool:gpu", 7)])
    with pytest.raises(Refused, match="no shard can serve this job"):
        fleet.job(meta_hosts=[("pool:gpu", 1)], dependency_labels=["wifi"])


def test_a_released_host_is_deleted_and_one_still_running_goes_missing_its_run_failed(fleet, heartbeat):
    """A worker's clean exit sends its hosts as `released`: idle ones leave the host list, not Missing."""
    discover(heartbeat, fleet, 1, [dev("lab1-7-1", worker_id="7"), dev("lab1-7-2", worker_id="7"), dev("d3")])
    hqe = running_on(fleet, heartbeat, "lab1-7-2")
    resp = heartbeat(
        fleet.lab1,
        fleet.token1,
        discovered={"generation": 2, "hosts": [dev("d3")], "released": ["lab1-7-1", "lab1-7-2"]},
    )
    assert resp["discovered_ack"] == {"generation": 2, "rejected": []}
    assert not Host.objects.filter(hostname="lab1-7-1").exists()
    assert Host.objects.get(hostname="lab1-7-2").status == "Missing"
    hqe = HostQueueEntry.objects.get(id=hqe.id)
    assert (hqe.status, hqe.failure) == ("Failed", "infra")
    audit = AuditRecord.objects.filter(action="host.discover").order_by("id").last()
    assert audit.details["released_hosts"] == ["lab1-7-1"] and audit.details["missing_hosts"] == ["lab1-7-2"]


def test_released_names_that_are_no_discovered_host_of_the_shard_delete_nothing(fleet, heartbeat):
    discover(heartbeat, fleet, 1, [dev("d1")])
    services.create_hosts(["dut-x"], acting_user=None, labels=["board:a"])
    before = Host.objects.count()
    resp = heartbeat(
        fleet.lab1, fleet.token1, discovered={"generation": 2, "hosts": [], "released": ["dut-x", 7, None]}
    )
    assert resp["discovered_ack"]["generation"] == 2
    assert Host.objects.count() == before
    assert Host.objects.get(hostname="d1").status == "Missing", "only a host of this shard's set can be released"


def test_a_discovered_host_people_moved_to_another_shard_is_no_longer_the_finders_to_lose_or_release(fleet, heartbeat):
    """Relabelled onto lab2, the host is lab2's: lab1's later sets neither mark it Missing nor release it."""
    discover(heartbeat, fleet, 1, [dev("d1"), dev("d2")])
    services.remove_label_from_hosts("board:a", ["d1", "d2"], acting_user=None)
    services.add_label_to_hosts("board:b", ["d1", "d2"], acting_user=None)
    assert set(Host.objects.filter(hostname__in=["d1", "d2"]).values_list("shard__hostname", flat=True)) == {"lab2"}
    before = list(Host.objects.filter(hostname__in=["d1", "d2"]).order_by("id").values())
    resp = heartbeat(fleet.lab1, fleet.token1, discovered={"generation": 2, "hosts": [], "released": ["d2"]})
    assert resp["discovered_ack"] == {"generation": 2, "rejected": []}
    assert list(Host.objects.filter(hostname__in=["d1", "d2"]).order_by("id").values()) == before
    Host.objects.filter(hostname__in=["d1", "d2"]).update(
        status="Missing", last_seen=timezone.now() - timedelta(days=400)
    )
    heartbeat(fleet.lab1, fleet.token1, discovered={"generation": 3, "hosts": []})
    assert Host.objects.filter(hostname__in=["d1", "d2"]).count() == 2, "lab1 may not forget lab2's hosts"


def test_hostnames_differing_only_in_case_are_one_host_never_a_second_beside_it(fleet, heartbeat):
    """Discovery takes hostnames without their case (a shard lower-cases what its sources find): a set
    naming `Dev-1` and `dev-1` names one host, and a name that only differs in case from a host on the
    master is refused rather than made a second host of the same device."""
    services.create_hosts(["Pixel-1"], labels=["board:a"], acting_user=None)
    before = list(Host.objects.order_by("id").values())
    resp = discover(
        heartbeat, fleet, 1, [dev("Dev-1", serial="1"), dev("dev-1", serial="2"), dev("pixel-1"), dev("B1")]
    )
    reasons = {r["hostname"]: r["reason"] for r in resp["discovered_ack"]["rejected"]}
    assert reasons == {
        "dev-1": "the set names this host twice (hostnames differing only in case are one); the first is kept",
        "pixel-1": "hostname pixel-1 differs only in case from host Pixel-1, which it would duplicate",
        "B1": "hostname B1 differs only in case from host b1, which it would duplicate",
    }
    assert list(Host.objects.exclude(hostname="Dev-1").order_by("id").values()) == before
    assert Host.objects.get(hostname="Dev-1").attributes == {"serial": "1"}
    # The exact name still confirms the declared host.
    resp = discover(heartbeat, fleet, 2, [dev("Dev-1"), dev("Pixel-1", serial="P")])
    assert resp["discovered_ack"]["rejected"] == []
    assert Host.objects.get(hostname="Pixel-1").attributes == {"serial": "P"}


def test_a_pool_with_more_labels_than_a_pool_may_have_is_a_400_naming_it(fleet, heartbeat):
    labels = [f"l{n}" for n in range(21)]
    resp = heartbeat(fleet.lab1, fleet.token1, expect=400, pools=[{"labels": labels, "max_hosts": 6}])
    assert resp["detail"]["field"] == "pools[0].labels" and "at most 20 labels, got 21" in resp["error"]
    assert Shard.objects.get(id=fleet.lab1.id).pools == []
