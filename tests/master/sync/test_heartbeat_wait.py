"""GET /api/v1/heartbeat/wait: the long-poll's authentication, its parameters, and its answers."""

import threading
import time

import pytest
from django.db import connection
from django.test import Client

from master import services
from tests.support import assert_status, news_held, news_settled

URL = "/api/v1/heartbeat/wait"


def get(client, token, **params):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(URL, params, **headers)


def test_a_wait_without_news_ends_at_its_timeout_with_news_false(fleet, client, news_listener):
    began = time.monotonic()
    resp = get(client, fleet.token1, timeout="0.3")
    assert_status(resp, 200)
    assert resp.json() == {"news": False}
    assert 0.3 * 0.75 <= time.monotonic() - began < 10  # the listener may take 2 s to start, a loaded CI more


def test_waits_begun_together_end_spread_over_the_last_quarter_of_their_timeout(fleet_committed, news_listener):
    """Else a fleet whose waits began together (a master's restart) would come back in one herd at
    every timeout, for as long as it runs."""
    began = time.monotonic()
    ends: list[float] = []
    answers: list[object] = []

    def wait(token: str) -> None:
        resp = get(Client(), token, timeout="1")
        ends.append(time.monotonic() - began)
        answers.append((resp.status_code, resp.json()))

    threads = [
        threading.Thread(target=wait, args=(token,)) for token in [fleet_committed.token1, fleet_committed.token2] * 4
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [(200, {"news": False})] * 8
    assert min(ends) >= 0.75 and max(ends) < 6  # a loaded machine runs the 8 threads late
    assert max(ends) - min(ends) > 0.02, ends


@pytest.mark.parametrize(
    ("token", "status", "field"),
    [(None, 401, "Authorization"), ("fs_nope", 401, "Authorization"), ("personal", 403, "Authorization")],
)
def test_a_wait_needs_a_shard_token(fleet, client, token, status, field):
    if token == "personal":
        _, token = services.create_personal_token("ana", acting_user=None)
    resp = get(client, token, timeout="0")
    assert_status(resp, status)
    assert resp.json()["detail"]["field"] == field


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"timeout": "-1"}, "timeout"),
        ({"timeout": "61"}, "timeout"),
        ({"timeout": "nan"}, "timeout"),
        ({"timeout": "x" * 10_000}, "timeout"),
        ({"since": "inf"}, "since"),
        ({"since": "1e9"}, "since"),
        ({"since": "\x00"}, "since"),
    ],
)
def test_a_bad_wait_is_a_400_naming_the_parameter(fleet, client, params, field):
    resp = get(client, fleet.token1, **params)
    assert_status(resp, 400)
    assert resp.json()["detail"]["field"] == field


def test_a_wait_is_a_get(fleet, client):
    resp = client.post(URL, HTTP_AUTHORIZATION=f"Bearer {fleet.token1}")
    assert_status(resp, 405)


def test_a_shard_learns_only_of_its_own_news(fleet_committed, client, news_listener):
    """lab2's wait outlasts a job created for lab1; lab1's, sent as it is created, ends at once."""
    fleet = fleet_committed
    # The world's own creation is news to both shards: heard before the waits begin, however late a
    # loaded machine delivers it (a fixed pause was outrun), so it cannot end lab2's.
    news_settled(news_listener)
    # lab1's "last heartbeat", asked about below: after every older news, well before the job. A gap,
    # not a pause to synchronise on: the `since` it makes must cover the request's own way to the view,
    # which a loaded machine stretched past the 0.1 s an earlier version allowed.
    last_heartbeat = time.monotonic()
    time.sleep(2.0)
    answers: dict[str, object] = {}

    def wait(name, token, timeout):
        try:
            answers[name] = (get(Client(), token, timeout=timeout).json(), time.monotonic())
        finally:
            connection.close()

    waits = [
        threading.Thread(target=wait, args=("lab1", fleet.token1, "10")),
        threading.Thread(target=wait, args=("lab2", fleet.token2, "5")),
    ]
    for thread in waits:
        thread.start()
    # Both waits held before the job: a loaded machine may take longer than any fixed pause to start them.
    news_held(news_listener, 2)
    created = time.monotonic()
    fleet.job()
    for thread in waits:
        thread.join(15)
    assert answers["lab1"][0] == {"news": True}
    assert answers["lab1"][1] - created < 5  # at once, not at its 10 s timeout (with room for a loaded machine)
    assert answers["lab2"][0] == {"news": False}
    # Asked a moment later, saying its last heartbeat was sent before the job: news at once; lab2's,
    # older than that heartbeat, is none.
    since = f"{time.monotonic() - last_heartbeat:.3f}"
    assert get(client, fleet.token1, since=since, timeout="10").json() == {"news": True}
    assert get(client, fleet.token2, since=since, timeout="0").json() == {"news": False}
