"""A served master killed (SIGKILL) while it delivers a notification: the restarted master delivers it,
with the same delivery id, to a real loopback receiver (docs/notifications.md)."""

import os
import signal

import pytest

from tests.master.notify.receiver import Receiver, hang
from tests.support import Master, serve, wait_until

ENV = {"FLEETSHARD_NOTIFY_ALLOW_PRIVATE": "1", "FLEETSHARD_NOTIFY_BACKOFF_S": "0.2", "FLEETSHARD_NOTIFY_POLL_S": "0.1"}


@pytest.mark.parametrize("own_master", [ENV], indirect=True)
def test_a_master_killed_mid_delivery_delivers_after_restart(own_master: Master) -> None:
    receiver = Receiver([hang(60.0)])  # the first attempt never gets its answer
    try:
        deliver_across_a_kill(own_master, receiver)
    except AssertionError as failed:
        raise AssertionError(f"{failed}\n{own_master.logs()}") from failed
    finally:
        receiver.close()


def deliver_across_a_kill(own_master: Master, receiver: Receiver) -> None:
    own_master.shell(
        "from master.notify import events, services\n"
        "from django.db import transaction\n"
        f"services.add_subscription(services.NewSubscription(url={receiver.url!r}, events=['host.missing']), "
        "acting_user=None)\n"
        "with transaction.atomic():\n"
        "    events.emit([events.Event('host.missing', {'host': 'dut1'})])\n"
        "result = None"
    )
    wait_until(lambda: len(receiver.got) == 1, timeout=30, what="the first attempt to reach the receiver")
    os.killpg(own_master.proc.pid, signal.SIGKILL)
    own_master.proc.wait(30)
    statuses = "from master.notify.models import Delivery as D\n"
    statuses += "result = list(D.objects.values_list('status', flat=True))"
    assert own_master.shell(statuses) == ["pending"]
    port = int(own_master.url.rsplit(":", 1)[1])
    own_master.proc = serve(own_master.role, port)
    wait_until(lambda: len(receiver.got) >= 2, timeout=60, what="the restarted master to deliver")
    first, again = receiver.got[0]["headers"], receiver.got[1]["headers"]
    assert first["X-Fleetshard-Delivery"] == again["X-Fleetshard-Delivery"]
    wait_until(
        lambda: (
            own_master.shell(
                "from master.notify.models import Delivery\n"
                "result = list(Delivery.objects.values_list('status', flat=True))"
            )
            == ["delivered"]
        ),
        timeout=30,
        what="the delivery to be recorded",
    )
