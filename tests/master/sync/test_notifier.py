"""Change notification: which shards hear of which changes, when, and what a long-poll answers."""

import random
import shutil
import tempfile
import threading
import time

import pytest
from django.db import transaction

from common.errors import FleetshardError
from master import services
from master.sync.notifier import NewsBoard, NewsUnavailable, TooManyWaits, decode, encode, wait_for_news
from tests.support import SilentDropProxy, news_held, news_settled, wait_until

# "At once", as against at the wait's 10 s timeout: well under it, with room for a loaded machine (CI runs
# the SQLite and PostgreSQL suites side by side on two cores, where a woken thread may wait its turn).
AT_ONCE_S = 5.0


def listening_board(max_waits: int = 10) -> NewsBoard:
    board = NewsBoard(max_waits)
    board.listening(time.monotonic() - 60)
    return board


def wait_in_thread(target, *args):
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(target(*args)))
    thread.start()
    return thread, result


def test_a_wait_ends_at_once_on_news_for_its_shard_and_not_for_another():
    board = listening_board()
    mine, got_mine = wait_in_thread(board.wait, 1, None, 10.0)
    other, got_other = wait_in_thread(board.wait, 2, None, 0.5)
    news_held(board, 2)
    began = time.monotonic()
    board.publish([1])
    mine.join(5)
    assert got_mine == [True] and time.monotonic() - began < AT_ONCE_S
    other.join(5)
    assert got_other == [False]
    assert board.held == 0


def test_news_since_the_last_heartbeat_ends_the_wait_at_once_and_older_news_does_not():
    board = listening_board()
    published = time.monotonic()
    board.publish([1])
    time.sleep(0.2)
    # The window reaches back past the news however late this line runs on a loaded machine.
    assert board.wait(1, since_s=time.monotonic() - published + 1.0, timeout_s=10.0) is True
    assert board.wait(1, since_s=0.1, timeout_s=0.0) is False
    assert board.wait(1, since_s=None, timeout_s=0.0) is False


def test_a_wait_reaching_back_before_the_listener_started_is_news():
    """The process may have missed news before it listened: the shard heartbeats rather than miss it."""
    board = NewsBoard(10)
    board.listening(time.monotonic())
    assert board.wait(1, since_s=5.0, timeout_s=10.0) is True


def test_a_board_that_hears_nothing_refuses_to_wait_and_a_lost_listener_ends_the_waits():
    board = NewsBoard(10)
    with pytest.raises(NewsUnavailable):
        board.wait(1, None, 1.0)
    board.listening(time.monotonic())
    thread, result = wait_in_thread(lambda: _raises(board.wait, 1, None, 10.0))
    news_held(board, 1)
    board.listening(None)
    thread.join(5)
    assert result == [NewsUnavailable]


def _raises(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        return type(exc)


def test_a_closing_board_ends_its_waits_without_news_and_holds_no_more():
    """A stopping process: its shards ask again at once (of its successor), not after their interval."""
    board = listening_board()
    thread, got = wait_in_thread(board.wait, 1, None, 10.0)
    news_held(board, 1)
    began = time.monotonic()
    board.close()
    board.listening(None)
    thread.join(5)
    assert got == [False] and time.monotonic() - began < AT_ONCE_S
    assert board.wait(1, None, 10.0) is False and board.held == 0


def test_a_wait_whose_client_left_ends_and_gives_its_place_back():
    from master.sync.notifier import GONE_CHECK_S

    board = listening_board()
    left = threading.Event()
    thread, got = wait_in_thread(board.wait, 1, None, 30.0, left.is_set)
    news_held(board, 1)
    began = time.monotonic()
    left.set()
    thread.join(GONE_CHECK_S + 5)
    assert got == [False] and time.monotonic() - began < GONE_CHECK_S + 3  # well under the wait's 30 s
    assert board.held == 0


def test_a_board_holds_at_most_its_waits():
    board = listening_board(max_waits=2)
    threads = [wait_in_thread(board.wait, 1, None, 10.0) for _ in range(2)]
    news_held(board, 2)
    with pytest.raises(TooManyWaits):
        board.wait(1, None, 1.0)
    board.publish([1])
    for thread, result in threads:
        thread.join(5)
        assert result == [True]


def test_one_shard_cannot_take_every_wait_of_a_process():
    board = listening_board(max_waits=100)
    threads = [wait_in_thread(board.wait, 1, None, 10.0) for _ in range(4)]
    news_held(board, 4)
    with pytest.raises(TooManyWaits, match="of this shard"):
        board.wait(1, None, 1.0)
    assert board.wait(2, None, 0.0) is False
    board.publish([1])
    for thread, result in threads:
        thread.join(5)
        assert result == [True]


def test_payloads_stay_under_the_notify_limit_and_decode_ignores_garbage():
    payloads = encode(range(1, 5000))
    assert all(len(p) <= 7000 for p in payloads) and len(payloads) > 1
    assert set().union(*(decode(p) for p in payloads)) == set(range(1, 5000))
    assert decode("1,x,-3,, 4,99999999999999999999,7") == {1, 7}


def wait_for(shard_id: int, since_s: float | None = None, timeout_s: float = 10.0):
    return wait_in_thread(wait_for_news, shard_id, since_s, timeout_s)


@pytest.fixture
def listening(transactional_db, news_listener):
    board = news_listener
    wait_until(lambda: board.listening_since is not None, timeout=5, interval=0.02, what="the listener")
    return board


def test_a_created_job_wakes_its_shards_wait_once_committed_and_no_other(fleet_committed, listening):
    fleet = fleet_committed
    lab1, got1 = wait_for(fleet.lab1.id)
    lab2, got2 = wait_for(fleet.lab2.id, timeout_s=3.0)
    news_held(listening, 2)
    began = time.monotonic()
    fleet.job()
    lab1.join(5)
    assert got1 == [True] and time.monotonic() - began < AT_ONCE_S
    lab2.join(5)
    assert got2 == [False]


@pytest.mark.parametrize(
    "change",
    [
        lambda f: services.lock_hosts(["a1"], "broken", acting_user=None),
        lambda f: services.unlock_hosts(["a1"], acting_user=None),
        lambda f: services.delete_hosts(["a3"], acting_user=None),
        lambda f: services.create_hosts(["a9"], labels=["board:a"], acting_user=None),
        lambda f: services.add_label_to_hosts("pool:x", ["a2"], acting_user=None),
        lambda f: services.abort_jobs([f.queued.id], acting_user=None),
    ],
    ids=["lock", "unlock", "delete", "create", "relabel", "abort"],
)
def test_every_change_a_shard_must_see_wakes_it(fleet_committed, listening, change):
    fleet_committed.queued = fleet_committed.job()
    news_settled(listening)
    thread, got = wait_for(fleet_committed.lab1.id)
    news_held(listening, 1)
    change(fleet_committed)
    thread.join(5)
    assert got == [True]


def test_a_host_moving_between_shards_wakes_both(fleet_committed, listening):
    news_settled(listening)
    waits = [wait_for(fleet_committed.lab1.id), wait_for(fleet_committed.lab2.id)]
    news_held(listening, 2)
    services.remove_label_from_shard("lab1", "board:a", acting_user=None)
    services.add_labels_to_shard("lab2", ["board:a"], acting_user=None)
    for thread, got in waits:
        thread.join(5)
        assert got == [True]


def test_a_refused_change_wakes_nobody(fleet_committed, listening):
    news_settled(listening)
    thread, got = wait_for(fleet_committed.lab1.id, timeout_s=1.0)
    news_held(listening, 1)
    with pytest.raises(FleetshardError):
        services.create_job(
            services.JobRequest(name="x", owner="ana", command="true", meta_hosts=[("board:a", 99)]), acting_user=None
        )
    thread.join(5)
    assert got == [False]


def test_a_change_rolled_back_by_an_outer_transaction_wakes_nobody(fleet_committed, listening):

    news_settled(listening)
    thread, got = wait_for(fleet_committed.lab1.id, timeout_s=1.0)
    news_held(listening, 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        fleet_committed.job()
        raise RuntimeError("the caller gives up")
    thread.join(5)
    assert got == [False]


@pytest.mark.postgres_only(reason="terminates the listener's PostgreSQL connection, as a database restart does")
def test_a_listener_whose_connection_the_database_drops_ends_the_waits_says_so_and_hears_again(
    fleet_committed, listening, caplog
):
    from django.db import connection

    from master.sync import notifier
    from master.sync.notifier import RECONNECT_S

    news_settled(listening)

    def wait_or_fail() -> object:
        try:
            return wait_for_news(fleet_committed.lab1.id, None, 3.0)
        except NewsUnavailable as exc:
            return exc

    thread, got = wait_in_thread(wait_or_fail)
    news_held(listening, 1)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
            " AND pid <> pg_backend_pid() AND datname = current_database()",
            [notifier.APPLICATION_NAME],
        )
        assert cur.fetchone() is not None
    thread.join(5)
    assert got and isinstance(got[0], NewsUnavailable)
    assert "change notifications lost" in caplog.text
    wait_until(
        lambda: listening.listening_since is not None, timeout=RECONNECT_S + 5, interval=0.05, what="the reconnect"
    )
    thread, got = wait_for(fleet_committed.lab1.id, 0.0)
    news_held(listening, 1)
    began = time.monotonic()
    fleet_committed.job()
    thread.join(5)
    assert got == [True] and time.monotonic() - began < AT_ONCE_S


def test_a_listener_that_cannot_listen_says_so_once_per_outage_not_every_retry(
    tmp_path, settings, monkeypatch, caplog, request
):
    """A data directory too long for a Unix socket: one warning naming it, not one every RECONNECT_S;
    once the directory is fixed, one line saying notifications are heard again."""
    from master.sync import notifier

    monkeypatch.setattr(notifier, "RECONNECT_S", 0.05)
    monkeypatch.setattr(notifier, "_is_postgres", lambda: False)  # the socket listener, on either database
    settings.DATA_DIR = str(tmp_path / ("d" * 120))
    short_dir = tempfile.mkdtemp(prefix="fs-", dir="/tmp")  # tmp_path itself may be too long
    request.addfinalizer(lambda: shutil.rmtree(short_dir, ignore_errors=True))
    board = NewsBoard(10)
    listener = notifier.Listener(board)
    with caplog.at_level("DEBUG", logger="master.sync.notifier"):
        listener.thread.start()
        try:
            # Three retries seen failing, however slowly a loaded machine runs them (not a fixed pause).
            wait_until(
                lambda: sum("still lost" in r.getMessage() for r in caplog.records) >= 3,
                timeout=10,
                interval=0.02,
                what="three failed retries",
            )
            settings.DATA_DIR = short_dir
            wait_until(lambda: board.listening_since is not None, timeout=5, interval=0.02, what="the listener")
        finally:
            listener.stop.set()
            listener.thread.join(5)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert "too long for a Unix socket" in warnings[0] and warnings[1] == "change notifications heard again"
    assert sum("still lost" in r.getMessage() for r in caplog.records) >= 3


def test_revoking_a_shards_token_ends_the_waits_held_with_it(fleet_committed, listening):
    token, _ = services.create_shard_token("lab1", acting_user=None)
    news_settled(listening)
    thread, got = wait_for(fleet_committed.lab1.id)
    news_held(listening, 1)
    began = time.monotonic()
    services.revoke_token(token.id, acting_user=None)
    thread.join(5)
    assert got == [True] and time.monotonic() - began < AT_ONCE_S


@pytest.mark.postgres_only(reason="a LISTEN connection dropped in silence is PostgreSQL's (SQLite uses a local socket)")
def test_a_listening_connection_dropped_in_silence_is_noticed_and_a_later_notification_still_wakes(
    transactional_db, monkeypatch
):
    """Nothing closes the connection, so nothing is readable on it: only the liveness round trip can
    tell it from a quiet one. Once it fails the listener connects again and hears what follows."""
    from django.db import connection
    from django.db.backends.postgresql.base import DatabaseWrapper

    from master.sync import notifier

    monkeypatch.setattr(notifier, "LIVENESS_S", 0.5, raising=False)
    monkeypatch.setattr(notifier, "LIVENESS_TIMEOUT_S", 1.0, raising=False)
    monkeypatch.setattr(notifier, "RECONNECT_S", 0.2)
    proxy = SilentDropProxy(int(connection.settings_dict["PORT"] or 5432))
    connection.ensure_connection()
    params = DatabaseWrapper.get_connection_params
    # New connections (the listener's) go through the proxy; this test's own is open already.
    monkeypatch.setattr(DatabaseWrapper, "get_connection_params", lambda w: params(w) | {"port": proxy.port})
    board = NewsBoard(10)
    listener = notifier.Listener(board)
    listener.thread.start()
    try:
        wait_until(lambda: board.listening_since is not None, 5, 0.02, "the listener")
        proxy.drop()
        began = time.monotonic()
        wait_until(lambda: board.listening_since is None, 10, 0.02, "the listener to notice the silent drop")
        # LIVENESS_S + LIVENESS_TIMEOUT_S and room for a loaded machine; the defaults' would take 15 s.
        assert time.monotonic() - began < 0.5 + 1.0 + 3.0
        wait_until(lambda: board.listening_since is not None, 5, 0.02, "the listener to connect again")
        thread, got = wait_in_thread(board.wait, 7, None, 5.0)
        news_held(board, 1)
        with connection.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", [notifier.CHANNEL, "7"])
        thread.join(6)
        assert got == [True]
    finally:
        listener.stop.set()
        listener.thread.join(5)
        proxy.close()
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()"
            )


def test_a_storm_wakes_every_wait_within_its_bound_but_not_all_at_once(monkeypatch):
    """A change that touches every shard (a label moved): 200 waits end within 200 / STORM_WAKES_PER_S
    = 1 s, spread over it, not in one instant; a change for one shard still wakes at once."""
    board = listening_board(max_waits=300)
    ended: dict[int, float] = {}

    def wait(shard_id: int) -> None:
        if board.wait(shard_id, None, 10.0):
            ended[shard_id] = time.monotonic()

    # The spread each woken wait was given, which a loaded machine cannot stretch as it does the wall clock.
    delays: list[float] = []
    uniform = random.uniform

    def noted(low: float, high: float) -> float:
        delays.append(uniform(low, high))
        assert high <= 1.0, high  # 200 / STORM_WAKES_PER_S
        return delays[-1]

    monkeypatch.setattr(random, "uniform", noted)
    threads = [threading.Thread(target=wait, args=(i,)) for i in range(1, 201)]
    for thread in threads:
        thread.start()
    wait_until(lambda: board.held == 200, 30, 0.02, "200 waits")
    began = time.monotonic()
    board.publish(range(1, 201))
    for thread in threads:
        thread.join(5)
    assert len(ended) == 200
    assert len(delays) == 200 and 0.5 < max(delays) <= 1.0
    assert sum(d < 0.1 for d in delays) < 60, sorted(delays)[:60]
    after = sorted(t - began for t in ended.values())
    assert after[-1] < 1.0 + AT_ONCE_S  # a loaded machine wakes the sleepers late, never early
    assert after[-1] > 0.5
    assert sum(t < 0.1 for t in after) < 60, after[:60]
    thread, got = wait_in_thread(board.wait, 1, None, 10.0)
    news_held(board, 1)
    began = time.monotonic()
    board.publish([1])
    thread.join(5)
    assert got == [True] and time.monotonic() - began < AT_ONCE_S
    assert len(delays) == 200  # no spread drawn for one wait: it answered at once
