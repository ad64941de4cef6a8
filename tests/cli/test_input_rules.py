"""The command line on input the master refuses: one line naming what is wrong, exit 1, nothing changed."""

import pytest
from django.contrib.auth.models import Permission, User

from master import services
from tests.cli.conftest import fails, ok, syntax_or_refusal
from tests.fleet_state import snapshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (("host", "create", "a/b"), "Error: invalid host name 'a/b': use letters, digits and . - _ : @ + = (no '..'"),
        (("host", "create", "../../etc"), "Error: invalid host name '../../etc'"),
        (("label", "create", "x\u202e"), "Error: invalid label name 'x\\u202e'"),
        (("shard", "create", ".."), "Error: invalid shard name '..'"),
        (("host", "create", "-i", "a=b=c", "-i", "x y=1", "n1"), "Error: invalid attribute name 'x y'"),
        (("job", "create", "-c", "true", "-m", "board:a*1_0", "j"), "Error: invalid meta-host 'board:a*1_0'"),
        (("job", "create", "-c", "true", "-m", "board:a*٣", "j"), "Error: invalid meta-host 'board:a*٣'"),
        (("job", "create", "-c", "true", "-m", "board:a*+3", "j"), "Error: invalid meta-host 'board:a*+3'"),
        (("job", "create", "-c", "true", "-m", "board:a", "-p", "²", "j"), "Error: invalid priority '²'"),
        (("job", "create", "-c", "true", "-m", "board:a", "-k", "a.b=1", "-k", "x/y=2", "j"),
         "Error: invalid keyval name 'x/y'"),
        (
            ("job", "create", "-c", "true", "-m", "board:b*100000", "j"),
            "Error: a job may have at most 500 host queue entries; this one asks for 100000",
        ),
        (
            ("job", "create", "-c", "true", "-m", "board:a*3", "-d", "wifi", "j"),
            "Error: job asks for 3 hosts with board:a (and dependency labels wifi) but shard lab1 has 2",
        ),
        (
            ("job", "create", "-c", "true", "-m", "board:a*2,wifi*2", "j"),
            "Error: job asks for 4 different hosts with board:a or wifi but shard lab1 has 3",
        ),
    ],
)  # fmt: skip
def test_refused_input_is_one_line_and_changes_nothing(cli, fleet, args, message):
    before = snapshot()
    fails(*syntax_or_refusal(cli(*args), message))
    assert snapshot() == before


def test_a_label_named_twice_asks_for_that_many_hosts(cli, fleet):
    out = ok(cli("job", "create", "-c", "true", "-m", "board:a*1,board:a", "-m", "wifi", "j")).stdout
    assert "3 host queue entries" in out


def test_staff_without_permissions_cannot_change_the_fleet(cli, fleet):
    User.objects.create_user("idle", is_staff=True)
    _, idle = services.create_personal_token("idle", acting_user=None)
    before = snapshot()
    fails(
        cli("host", "mod", "--lock", "a1", token=idle),
        "Error: permission denied: only staff with the common.change_host permission may lock hosts",
    )
    fails(
        cli("shard", "create", "lab9", token=idle),
        "Error: permission denied: only staff with the common.add_shard and common.change_shard permissions",
    )
    assert snapshot() == before
    User.objects.get(username="idle").user_permissions.set(Permission.objects.filter(codename="change_host"))
    ok(cli("host", "mod", "--lock", "a1", token=idle))
