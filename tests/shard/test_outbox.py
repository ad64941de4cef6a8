"""Every HQE status change on a shard is an update with a seq that only grows."""

import pytest

from common.constants import FailureClass, HQEStatus
from common.errors import FleetshardError
from common.models import HostQueueEntry, Job
from shard.models import OutboxEntry
from shard.outbox import pending
from shard.services import finish_hqe, transition_hqe


@pytest.fixture
def hqe(db: None) -> HostQueueEntry:
    job = Job.objects.create(id=99, name="smoke", owner="ana", command="true")
    return HostQueueEntry.objects.create(id=501, job=job)


def test_every_status_change_is_an_update_in_order(hqe):
    transition_hqe(hqe.id, "Running")
    finish_hqe(hqe.id, "Failed", failure="test", exit_code=3, log_tail="boom")
    first, second = pending(10)
    assert first["seq"] < second["seq"]
    assert (first["status"], first["hqe"], first["job"]) == ("Running", 501, 99)
    assert first["started_on"].endswith("Z") and first["at"].endswith("Z")
    assert second | {"seq": 0, "started_on": "", "finished_on": "", "at": ""} == {
        "seq": 0,
        "hqe": 501,
        "job": 99,
        "status": "Failed",
        "host": None,
        "started_on": "",
        "finished_on": "",
        "failure": "test",
        "exit_code": 3,
        "log_tail": "boom",
        "at": "",
    }
    assert Job.objects.get(id=99).status == "Failed"


def test_seq_is_never_reused_after_the_outbox_empties(hqe):
    transition_hqe(hqe.id, "Running")
    last = OutboxEntry.objects.get().seq
    OutboxEntry.objects.all().delete()
    finish_hqe(hqe.id, "Completed", exit_code=0)
    assert OutboxEntry.objects.get().seq > last


def test_terminal_hqe_never_changes_again(hqe):
    finish_hqe(hqe.id, "Completed", exit_code=0)
    with pytest.raises(FleetshardError, match="cannot go from Completed to Running"):
        transition_hqe(hqe.id, "Running")
    assert OutboxEntry.objects.count() == 1


def test_failed_needs_a_failure_class(hqe):
    with pytest.raises(FleetshardError, match="failure class"):
        finish_hqe(hqe.id, "Failed")
    assert not OutboxEntry.objects.exists()
    assert HostQueueEntry.objects.get(id=hqe.id).status == "Queued"


def test_a_refusal_names_the_failure_class_as_its_word(hqe):
    """The scheduler passes the StrEnum members; the message (and the log line quoting it) shows the word."""
    with pytest.raises(FleetshardError) as refused:
        finish_hqe(hqe.id, HQEStatus.COMPLETED, failure=FailureClass.TEST)
    assert refused.value.message == "failure class 'test' does not fit status Completed"


def test_log_tail_is_capped_at_16_kib(hqe):
    finish_hqe(hqe.id, "Completed", exit_code=0, log_tail="x" * 20000 + "END")
    tail = HostQueueEntry.objects.get(id=hqe.id).log_tail
    assert len(tail) == 16 * 1024 and tail.endswith("END")
