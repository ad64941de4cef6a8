"""Label-based assignment and job routing (docs/design.md, "Assignment")."""

import pytest

from common.errors import FleetshardError, NotFound, Refused
from common.models import Host, HostQueueEntry, Job, Label
from common.syntax import parse_priority
from master import services


def host(name: str) -> Host:
    return Host.objects.get(hostname=name)


def test_host_is_assigned_by_its_label(fleet):
    assert host("a1").shard == fleet.lab1
    assert host("b1").shard == fleet.lab2
    assert host("c1").shard is None


def test_adding_a_shard_label_to_a_host_assigns_it_and_raises_its_version(fleet):
    before = host("c1").version
    services.add_labels_to_shard("lab2", ["board:c"], acting_user=None)
    assert host("c1").shard == fleet.lab2
    assert host("c1").version > before


def test_job_is_routed_by_meta_host_label(fleet):
    services.create_hosts(["b2"], labels=["board:b"], acting_user=None)
    job = fleet.job(meta_hosts=[("board:b", 2)])
    assert job.shard == fleet.lab2
    assert [h.meta_host.name for h in job.hqes.all()] == ["board:b", "board:b"]


def test_job_is_routed_by_dependency_label(fleet):
    job = fleet.job(meta_hosts=[("wifi", 1)], dependency_labels=["board:b"])
    assert job.shard == fleet.lab2


def test_job_is_routed_by_named_host(fleet):
    job = fleet.job(meta_hosts=[], hosts=["a2"])
    assert job.shard == fleet.lab1
    assert job.hqes.get().host == host("a2")


def test_job_spanning_shards_is_refused_naming_both(fleet):
    with pytest.raises(Refused, match="spans shards.*lab1.*lab2"):
        fleet.job(meta_hosts=[("board:a", 1), ("board:b", 1)])
    assert not Job.objects.exists()


def test_ambiguous_non_shard_label_is_refused(fleet):
    with pytest.raises(Refused, match="lab1, lab2 can all serve"):
        fleet.job(meta_hosts=[("wifi", 1)])


def test_job_no_shard_can_serve_says_which_label_is_missing_where(fleet):
    with pytest.raises(Refused, match="on shard lab1, no host for meta-host board:a has pool:x"):
        fleet.job(meta_hosts=[("board:a", 1)], dependency_labels=["pool:x"])
    with pytest.raises(Refused, match="no host with label board:c is assigned to a shard"):
        fleet.job(meta_hosts=[("board:c", 1)])
    assert not Job.objects.exists() and not HostQueueEntry.objects.exists()


def test_label_on_two_shards_is_refused(fleet):
    with pytest.raises(Refused, match="label board:a already belongs to shard lab1"):
        services.add_labels_to_shard("lab2", ["board:a"], acting_user=None)
    assert Label.objects.get(name="board:a").shard == fleet.lab1


def test_host_with_labels_of_two_shards_is_refused(fleet):
    with pytest.raises(Refused, match=r"a1 would have labels of two shards: board:a \(shard lab1\) and board:b"):
        services.add_label_to_hosts("board:b", ["a1"], acting_user=None)
    assert sorted(host("a1").labels.values_list("name", flat=True)) == ["board:a", "wifi"]
    with pytest.raises(Refused, match="two shards"):
        services.create_hosts(["new"], labels=["board:a", "board:b"], acting_user=None)
    assert not Host.objects.filter(hostname="new").exists()


def test_shard_label_that_would_split_a_host_is_refused(fleet):
    services.add_label_to_hosts("board:c", ["a1"], acting_user=None)
    with pytest.raises(Refused, match="two shards"):
        services.add_labels_to_shard("lab2", ["board:c"], acting_user=None)
    assert Label.objects.get(name="board:c").shard is None


def test_removing_a_label_from_a_shard_unassigns_its_hosts_but_keeps_jobs(fleet):
    job = fleet.job()
    version = host("a1").version
    services.remove_label_from_shard("lab1", "board:a", acting_user=None)
    assert host("a1").shard is None and host("a1").version > version
    assert Job.objects.get(id=job.id).shard == fleet.lab1


def test_lock_and_unlock_raise_the_version(fleet):
    v = host("a1").version
    services.lock_hosts(["a1"], "flaky usb", acting_user=None)
    locked = host("a1")
    assert locked.locked and locked.lock_reason == "flaky usb" and locked.version == v + 1
    services.unlock_hosts(["a1"], acting_user=None)
    assert not host("a1").locked and host("a1").version == v + 2


def test_abort_raises_the_job_version_once(fleet):
    job = fleet.job()
    services.abort_jobs([job.id], acting_user=None)
    services.abort_jobs([job.id], acting_user=None)
    job.refresh_from_db()
    assert job.aborted and job.version == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"priority": "urgent"}, "invalid priority 'urgent'"),
        ({"timeout_mins": 0}, "timeout_mins must be an integer from 1 to 2147483647, not 0"),
        ({"meta_hosts": [("nope", 1)]}, "unknown label nope"),
        ({"meta_hosts": [], "hosts": ["ghost"]}, "unknown host ghost"),
        ({"meta_hosts": [("board:a", 0)]}, "must be at least 1"),
        ({"parent_id": 999}, "unknown parent job 999"),
    ],
)
def test_bad_job_input_is_refused_and_changes_nothing(fleet, kwargs, message):
    with pytest.raises(FleetshardError, match=message):
        fleet.job(**kwargs)
    assert not Job.objects.exists()


def test_named_priorities_are_read_at_the_edge(fleet):
    assert fleet.job(priority=parse_priority("super")).priority == 80
    assert fleet.job(priority=parse_priority("low")).priority == 10


def test_unknown_names_are_named_in_errors(fleet):
    with pytest.raises(NotFound, match="unknown hosts ghost, zed"):
        services.lock_hosts(["zed", "ghost", "a1"], acting_user=None)
    assert not host("a1").locked
    with pytest.raises(Refused, match="label wifi already exists"):
        services.create_labels(["wifi"], acting_user=None)
    with pytest.raises(FleetshardError, match="invalid label name"):
        services.create_labels(["has space"], acting_user=None)


def test_deleting_a_host_with_an_active_job_is_refused(fleet):
    job = fleet.job(meta_hosts=[], hosts=["a1"])
    with pytest.raises(Refused, match=f"host a1 has active job {job.id}"):
        services.delete_hosts(["a1"], acting_user=None)
    assert Host.objects.filter(hostname="a1").exists()


def test_deleting_a_shard_aborts_its_jobs_and_frees_its_labels(fleet):
    job = fleet.job()
    services.delete_shards(["lab1"], acting_user=None)
    job.refresh_from_db()
    assert job.status == "Aborted" and job.shard is None
    assert Label.objects.get(name="board:a").shard is None and host("a1").shard is None
