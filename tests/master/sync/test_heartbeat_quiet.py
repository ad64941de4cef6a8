"""A quiet heartbeat on PostgreSQL (master/sync/heartbeat.py, `_quiet_heartbeat`): its two statements are
prepared once per connection, and nothing that happens to that connection between or during
heartbeats (a killed backend, statements gone, a name already taken) costs more than the one
heartbeat it interrupts, nor applies anything twice. Also the races that need PostgreSQL's row locks to
interleave (SQLite runs one writer at a time)."""

import itertools
import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from django.db import connection, transaction

from common import admission
from common.models import HostQueueEntry, Shard
from master.sync import heartbeat as master_heartbeat
from tests.support import assert_status

from .test_heartbeat import known, known_hosts, update


@pytest.fixture(autouse=True)
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements, synchronous_commit and row locks are PostgreSQL's")


@pytest.fixture
def one_slot(transactional_db, monkeypatch):
    """One work slot, as `serve` lends it: every request below runs on the same persistent connection
    (kept a minute and checked before reuse, as server/settings/master.py says; the tests' settings open
    one per request)."""
    admission.limit_work(1)
    slot = admission._slots.queue[0]["default"]
    monkeypatch.setitem(slot.settings_dict, "CONN_MAX_AGE", 60)
    monkeypatch.setitem(slot.settings_dict, "CONN_HEALTH_CHECKS", True)
    yield slot
    pool = admission._slots
    admission._slots = None
    while pool is not None and not pool.empty():
        for wrapper in pool.get().values():
            wrapper.close()


def _other_connection():
    params = connection.get_connection_params()
    conn = psycopg2.connect(**params)
    conn.autocommit = True
    return conn


def _wait_for_a_lock(cur, pid: int) -> None:
    for _ in range(200):
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cur.fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.05)
    pytest.fail("the heartbeat never waited for the shard's lock")


def _settled(fleet, heartbeat):
    """The shard's first heartbeat, and what a quiet one then sends (it knows everything)."""
    first = heartbeat(fleet.lab1, fleet.token1)
    return first, {"known_hosts": known_hosts(first["hosts"]), "known_jobs": known(first["jobs"])}


def _running_update(fleet, first, seq):
    hqe = HostQueueEntry.objects.get(job_id=first["jobs"][0]["id"])
    host = first["hosts"][0]["id"]
    return hqe, update(seq, hqe, "Running", host=host, started_on="2026-01-01T00:00:00Z")


def test_a_quiet_heartbeat_inside_a_transaction_leaves_that_transaction_durable(fleet, heartbeat):
    # The test's transaction stands for any caller's: what else it writes must still wait for the disk.
    _, quiet = _settled(fleet, heartbeat)
    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []
    with transaction.atomic(), connection.cursor() as cursor:
        master_heartbeat.process_heartbeat(fleet.lab1, _request(fleet.lab1, quiet))
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def _request(shard, quiet):
    from common.wire import HeartbeatRequest
    from tests.conftest import Heartbeat

    return HeartbeatRequest.parse(Heartbeat(None).body(shard, **quiet))


def test_after_its_connection_was_killed_the_next_heartbeats_work_and_apply_each_update_once(
    fleet_committed, heartbeat, one_slot
):
    fleet = fleet_committed
    fleet.job()
    first, quiet = _settled(fleet, heartbeat)
    heartbeat(fleet.lab1, fleet.token1, **quiet)  # prepares its statements on the slot's connection
    killer = _other_connection()
    with killer.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [one_slot.connection.get_backend_pid()])
    try:
        hqe, running = _running_update(fleet, first, 1)
        for _ in range(2):  # the update, then its retry (an answer lost on the way back)
            resp = heartbeat(fleet.lab1, fleet.token1, **quiet, updates=[running])
            assert resp["acks"] == [{"seq": 1, "result": "accepted"}]
        for _ in range(2):
            assert heartbeat(fleet.lab1, fleet.token1, **quiet)["acks"] == []
        hqe.refresh_from_db()
        shard = Shard.objects.get(id=fleet.lab1.id)
        assert (hqe.status, hqe.last_seq, shard.updates_applied, shard.last_updates_count) == ("Running", 1, 1, 0)
    finally:
        killer.close()


def test_a_quiet_heartbeat_killed_while_it_waits_for_the_shards_lock_is_a_503_and_the_next_one_works(
    fleet_committed, heartbeat, one_slot
):
    fleet = fleet_committed
    _, quiet = _settled(fleet, heartbeat)
    heartbeat(fleet.lab1, fleet.token1, **quiet)
    noted = Shard.objects.get(id=fleet.lab1.id).last_heartbeat
    locker, killer = _other_connection(), _other_connection()
    locker.autocommit = False
    statuses: list[int] = []
    try:
        with locker.cursor() as cur:
            cur.execute("SELECT 1 FROM common_shard WHERE id = %s FOR UPDATE", [fleet.lab1.id])
        pid = one_slot.connection.get_backend_pid()
        body = json.dumps(heartbeat.body(fleet.lab1, **quiet))
        waiting = threading.Thread(target=lambda: statuses.append(heartbeat.post_raw(body, fleet.token1).status_code))
        waiting.start()
        with killer.cursor() as cur:
            _wait_for_a_lock(cur, pid)
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])
        waiting.join(10)
        assert statuses == [503]
        locker.commit()
        assert Shard.objects.get(id=fleet.lab1.id).last_heartbeat == noted  # the killed one noted nothing
        assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []
        assert Shard.objects.get(id=fleet.lab1.id).last_heartbeat > noted
    finally:
        locker.close()
        killer.close()


def test_a_quiet_heartbeat_whose_statements_the_connection_lost_prepares_them_again_at_once(
    fleet_committed, heartbeat, one_slot
):
    # What a pooler's reset (DISCARD ALL) or a transaction pooler's other server connection does.
    fleet = fleet_committed
    _, quiet = _settled(fleet, heartbeat)
    heartbeat(fleet.lab1, fleet.token1, **quiet)
    before = Shard.objects.get(id=fleet.lab1.id).last_heartbeat
    with one_slot.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []
    assert Shard.objects.get(id=fleet.lab1.id).last_heartbeat > before
    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []


def test_a_quiet_heartbeat_whose_statements_name_is_taken_on_its_connection_takes_another(
    fleet_committed, heartbeat, one_slot, monkeypatch
):
    # Another process's statements, on a server connection a transaction pooler shares.
    fleet = fleet_committed
    _, quiet = _settled(fleet, heartbeat)
    monkeypatch.setattr(master_heartbeat, "_prepared_serial", itertools.count(10**6))
    master_heartbeat._prepared.clear()
    with one_slot.cursor() as cur:
        cur.execute(f"PREPARE fleetshard_quiet{os.getpid()}_{10**6}_note AS SELECT 1")
    before = Shard.objects.get(id=fleet.lab1.id).last_heartbeat
    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []
    assert Shard.objects.get(id=fleet.lab1.id).last_heartbeat > before
    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []


def test_a_new_instance_whose_takeover_another_heartbeat_of_it_just_made_keeps_its_instance_since(
    fleet_committed, heartbeat, one_slot
):
    # Two heartbeats of the new instance at once (a retry racing its original): the second finds the
    # instance on record is its own only once it holds the shard's lock, and must not restart its time.
    fleet = fleet_committed
    new = heartbeat.instance_of("another-database")
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    one_slot.ensure_connection()
    locker, watcher = _other_connection(), _other_connection()
    locker.autocommit = False
    statuses: list[int] = []
    try:
        with locker.cursor() as cur:
            cur.execute("SELECT 1 FROM common_shard WHERE id = %s FOR UPDATE", [fleet.lab1.id])
            cur.execute(
                "UPDATE common_shard SET instance = %s, instance_since = %s, last_heartbeat = now() WHERE id = %s",
                [new, since, fleet.lab1.id],
            )
        body = json.dumps(heartbeat.body(fleet.lab1, instance=new))
        second = threading.Thread(target=lambda: statuses.append(heartbeat.post_raw(body, fleet.token1).status_code))
        second.start()
        with watcher.cursor() as cur:
            _wait_for_a_lock(cur, one_slot.connection.get_backend_pid())
        locker.commit()
        second.join(10)
        assert statuses == [200]
        shard = Shard.objects.get(id=fleet.lab1.id)
        assert (shard.instance, shard.instance_since) == (new, since)
    finally:
        locker.close()
        watcher.close()


def test_quiet_heartbeats_racing_ones_with_updates_of_the_same_shard_all_answer_and_apply_each_update_once(
    fleet_committed, heartbeat, monkeypatch
):
    # Four clients of one shard on two slots (a retry racing its original, a leader handing over): quiet
    # heartbeats whose statuses disagree, beside the same update sent again and again.
    fleet = fleet_committed
    fleet.job()
    first, quiet = _settled(fleet, heartbeat)
    hqe, running = _running_update(fleet, first, 1)
    admission.limit_work(2)
    pool = admission._slots
    for wrappers in pool.queue:
        monkeypatch.setitem(wrappers["default"].settings_dict, "CONN_MAX_AGE", 60)
    statuses: list[int] = []
    lock = threading.Lock()

    def send(extra) -> None:
        for _ in range(15):
            code = heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1, **extra)), fleet.token1).status_code
            with lock:
                statuses.append(code)

    repairing = {**quiet, "known_hosts": [{**h, "status": "Repairing"} for h in quiet["known_hosts"]]}
    extras = [quiet, repairing, {**quiet, "updates": [running]}, {**quiet, "updates": [running]}]
    try:
        threads = [threading.Thread(target=send, args=(extra,)) for extra in extras]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        admission._slots = None
        while not pool.empty():
            for wrapper in pool.get().values():
                wrapper.close()
    assert statuses == [200] * 60
    hqe.refresh_from_db()
    shard = Shard.objects.get(id=fleet.lab1.id)
    assert (hqe.status, hqe.last_seq, shard.updates_applied) == ("Running", 1, 1)


def test_a_quiet_heartbeats_lazy_commit_ends_with_it(fleet_committed, heartbeat):
    """Outside any transaction, as served, a quiet heartbeat is noted in a commit that does not wait
    for the disk; the connection's next transaction (an update's) waits again."""
    assert not connection.in_atomic_block
    for _ in range(2):  # the second runs the statements the first prepared
        resp = heartbeat(fleet_committed.lab1, fleet_committed.token1)
        assert resp["acks"] == [] and resp["hosts"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    assert Shard.objects.get(id=fleet_committed.lab1.id).last_heartbeat is not None


def _wait_for_any_lock(cur) -> None:
    for _ in range(200):
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if cur.fetchone()[0]:
            return
        time.sleep(0.05)
    pytest.fail("the heartbeat never waited for the shard's lock")


@pytest.mark.parametrize("quiet_one", [True, False])
def test_a_shard_deleted_while_its_heartbeat_waits_for_its_lock_is_a_401_not_a_500(
    fleet_committed, heartbeat, quiet_one
):
    """Issue 23: the heartbeat's `select_for_update().get()` found no shard and raised DoesNotExist."""
    from master import services

    fleet = fleet_committed
    _, quiet = _settled(fleet, heartbeat)
    body = json.dumps(heartbeat.body(fleet.lab1, **(quiet if quiet_one else {})))
    answers: list[tuple[int, dict]] = []

    def beat() -> None:
        resp = heartbeat.post_raw(body, fleet.token1)
        answers.append((resp.status_code, resp.json()))

    watcher = _other_connection()
    try:
        with transaction.atomic():
            Shard.objects.select_for_update().get(id=fleet.lab1.id)
            waiting = threading.Thread(target=beat)
            waiting.start()
            with watcher.cursor() as cur:
                _wait_for_any_lock(cur)
            services.delete_shards(["lab1"], acting_user=None)
        waiting.join(20)
    finally:
        watcher.close()
    [(status, answer)] = answers
    assert status == 401, answer
    assert answer["error"] == "unknown or revoked shard token: shard lab1 was deleted"


def test_a_heartbeat_that_waited_for_the_lock_never_moves_last_heartbeat_back(fleet_committed, heartbeat):
    """Issue 23: a heartbeat takes its time, then waits for the shard's row lock; one that came later and
    did not wait wrote a later time, which the first then overwrote with its earlier one."""
    fleet = fleet_committed
    _, quiet = _settled(fleet, heartbeat)
    for quiet_one in (True, False):
        body = json.dumps(heartbeat.body(fleet.lab1, **(quiet if quiet_one else {})))
        statuses: list[int] = []

        def beat(body: str = body, statuses: list[int] = statuses) -> None:
            statuses.append(heartbeat.post_raw(body, fleet.token1).status_code)

        watcher = _other_connection()
        try:
            with transaction.atomic():
                Shard.objects.select_for_update().get(id=fleet.lab1.id)
                waiting = threading.Thread(target=beat)
                waiting.start()
                with watcher.cursor() as cur:
                    _wait_for_any_lock(cur)
                # What the later heartbeat, which did not wait, wrote meanwhile.
                later = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
                Shard.objects.filter(id=fleet.lab1.id).update(last_heartbeat=later)
            waiting.join(20)
        finally:
            watcher.close()
        assert statuses == [200]
        assert Shard.objects.get(id=fleet.lab1.id).last_heartbeat == later


def test_statements_a_lock_timeout_orphaned_are_deallocated_by_the_next_quiet_heartbeat(
    fleet_committed, heartbeat, one_slot
):
    """Issue 23: a quiet heartbeat cut by a lock (or statement) timeout after its PREPAREs ran left them on
    the connection under a name no longer used, until the connection closed."""
    fleet = fleet_committed
    _, quiet = _settled(fleet, heartbeat)

    def prepared() -> list[str]:
        with one_slot.cursor() as cur:
            cur.execute("SELECT name FROM pg_prepared_statements ORDER BY name")
            return [name for (name,) in cur.fetchall()]

    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []
    first = prepared()
    assert len(first) == 2
    with one_slot.cursor() as cur:
        cur.execute("SET lock_timeout = '200ms'")
    locker = _other_connection()
    locker.autocommit = False
    try:
        with locker.cursor() as cur:
            cur.execute("SELECT 1 FROM common_shard WHERE id = %s FOR UPDATE", [fleet.lab1.id])
        assert_status(heartbeat.post_raw(json.dumps(heartbeat.body(fleet.lab1, **quiet)), fleet.token1), 503)
        assert prepared() == first  # still there, their name dropped
        locker.commit()
    finally:
        locker.close()
    with one_slot.cursor() as cur:
        cur.execute("RESET lock_timeout")
    assert heartbeat(fleet.lab1, fleet.token1, **quiet)["hosts"] == []
    now = prepared()
    assert len(now) == 2 and set(now).isdisjoint(first), now  # the new name's two, none of the old


def test_a_quiet_heartbeats_holdings_are_read_from_indexes_alone(fleet_committed, heartbeat):
    # Wherever a shard's rows lie in the tables (at a million hosts, each of its hosts on a page of its
    # own), its heartbeat reads a few index pages, no table page, once (auto)vacuum has marked the
    # pages all-visible (common migration 0014). Vacuumed here: earlier tests leave dead rows.
    fleet = fleet_committed
    _settled(fleet, heartbeat)
    from common.constants import JobStatus

    sql = master_heartbeat._Statements.of(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) common_host")
        cursor.execute("VACUUM (ANALYZE) common_job")
    with transaction.atomic(), connection.cursor() as cursor:
        # Small tables: which plan would a large one get? Neither a table scan nor a bitmap of its pages.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        params = [fleet.lab1.id, fleet.lab1.id, *JobStatus.ACTIVE]
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql.holdings, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Only Scan using host_shard_holdings_idx on common_host" in plan, plan
    assert "Index Only Scan using job_shard_holdings_idx on common_job" in plan, plan
    assert plan.count("Heap Fetches: 0") == 2, plan
    with connection.cursor() as cursor:  # and autovacuum marks them again once a fiftieth changed
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname IN ('common_host', 'common_job')")
        options = dict(cursor.fetchall())
    for table in ("common_host", "common_job"):
        assert "autovacuum_vacuum_scale_factor=0.02" in options[table], options
        assert "autovacuum_vacuum_insert_scale_factor=0.02" in options[table], options
