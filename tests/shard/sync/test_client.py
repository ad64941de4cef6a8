"""The shard's heartbeat client against a real master process: faults and races converge.

The test database is the shard's; the master runs under gunicorn on its own database.
"""

import dataclasses
import json
import logging
import threading
import time
import uuid
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from common.models import Host, HostQueueEntry, Job
from shard.locks import shard_write
from shard.models import DiscoveryState, HostEvent, OutboxEntry, ShardState
from shard.outbox import enqueue_host_event
from shard.services import finish_hqe, move_host, transition_hqe
from shard.sync import client as client_module
from shard.sync import ingest
from shard.sync.client import HeartbeatClient, HeartbeatFailed, ProtocolRefused, TokenRefused, jittered
from shard.sync.discovery import parse_sources, record_set, run_sources
from tests.support import Master, free_port, make_world, wait_until


@pytest.fixture
def world(master_server: Master) -> dict[str, Any]:
    return make_world(master_server, f"c{uuid.uuid4().hex[:6]}", hosts=2, jobs=1, hqes_per_job=2)


def client_for(master: Master, world: dict[str, Any]) -> HeartbeatClient:
    return HeartbeatClient(master.url, world["shard"], world["token"])


def master_state(master: Master, world: dict[str, Any]) -> dict[str, Any]:
    return master.shell(
        f"""
from common.models import Job, Shard, HostQueueEntry
shard = Shard.objects.get(id={world["shard_id"]})
result = {{"applied": shard.updates_applied,
          "jobs": dict(Job.objects.filter(id__in={world["jobs"]}).values_list("id", "status")),
          "hqes": sorted(HostQueueEntry.objects.filter(job_id__in={world["jobs"]}).values_list("status", flat=True))}}
"""
    )


def run_all_hqes_to_completion() -> None:
    hosts = list(Host.objects.order_by("id"))
    for i, hqe in enumerate(HostQueueEntry.objects.order_by("id")):
        # A job never uses a host twice (the master rejects it): its HQEs run on the hosts in turn.
        transition_hqe(hqe.id, "Running", host_id=hosts[i % len(hosts)].id)
        finish_hqe(hqe.id, "Completed", exit_code=0)


def test_jitter_stays_within_ten_percent():
    values = [jittered(10) for _ in range(500)]
    assert all(9 <= v <= 11 for v in values) and max(values) - min(values) > 0.5


def test_first_heartbeat_brings_hosts_and_jobs(transactional_db, master_server, world):
    client = client_for(master_server, world)
    response, result = client.tick()
    assert sorted(Host.objects.values_list("id", flat=True)) == sorted(world["hosts"])
    assert list(Job.objects.values_list("id", flat=True)) == world["jobs"]
    assert HostQueueEntry.objects.count() == 2 and result.jobs == 1
    assert client.tick()[0].jobs == []


def test_lost_response_converges_with_nothing_lost_or_doubled(transactional_db, master_server, world):
    client = client_for(master_server, world)
    client.tick()
    run_all_hqes_to_completion()
    client.exchange(client.build_request())  # the master commits; the answer never arrives
    assert OutboxEntry.objects.count() == 4
    assert master_state(master_server, world)["applied"] == 4
    client.tick()
    assert not OutboxEntry.objects.exists()
    state = master_state(master_server, world)
    assert state == {"applied": 4, "jobs": {str(world["jobs"][0]): "Completed"}, "hqes": ["Completed"] * 2}
    assert client.build_request()["known_jobs"] == []


def master_discovered(master: Master, world: dict[str, Any]) -> dict[str, Any]:
    return master.shell(
        f"""
from common.models import Host, Shard
from master.models import AuditRecord
shard = Shard.objects.get(id={world["shard_id"]})
result = {{"generation": shard.discovered_generation,
          "hosts": sorted(Host.objects.filter(discovered_by=shard).values_list("id", "hostname", "version", "status")),
          "audits": AuditRecord.objects.filter(action="host.discover", actor="shard:" + shard.hostname).count()}}
"""
    )


def test_a_lost_response_to_a_discovered_set_changes_nothing(transactional_db, master_server, world):
    """The master applies the generation and commits; its answer never arrives; the shard sends the same
    generation again: nothing is created, changed or audited twice, and the shard takes the ack."""
    client = client_for(master_server, world)
    client.tick()
    record_set(
        [{"hostname": f"{world['shard']}-d{i}", "labels": [world["label"]], "attributes": {}} for i in (1, 2)], {}
    )
    client.exchange(client.build_request())  # the master commits; the answer never arrives
    applied = master_discovered(master_server, world)
    assert applied["generation"] == 1 and len(applied["hosts"]) == 2 and applied["audits"] == 1
    assert DiscoveryState.objects.get().acked_generation == 0, "the shard never saw the ack"
    client.tick()
    assert master_discovered(master_server, world) == applied
    assert DiscoveryState.objects.get().acked_generation == 1
    assert "discovered" not in client.build_request()


def test_hostile_names_a_source_finds_come_back_refused_each_with_its_reason(
    transactional_db, master_server, world, tmp_path, caplog
):
    """A file: or command: source's names are not cleaned on the shard (only lower-cased): the master
    judges them and says why, the shard keeps the reasons (admin, `shard stat`) and logs each once."""
    client = client_for(master_server, world)
    client.tick()
    names = ["a/b", "../up", "bell\x07", "evil\u202egnp", f"{world['shard']}-ok"]
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"hostname": n, "labels": [world["label"]]} for n in names]))
    record_set(*run_sources(parse_sources(f"file:{path}")))
    with caplog.at_level(logging.WARNING, logger="shard.sync.discovery"):
        client.tick()
    reasons = {r["hostname"]: r["reason"] for r in DiscoveryState.objects.get().rejected}
    assert sorted(reasons) == sorted(["../up", "a/b", "bell\\u0007", "evil\\u202egnp"])
    assert all(reason.startswith("invalid hostname: use letters, digits") for reason in reasons.values())
    assert sum("the master refused discovered host" in m for m in caplog.messages) == 4
    assert master_discovered(master_server, world)["hosts"][0][1] == f"{world['shard']}-ok"
    client.tick()
    assert sum("the master refused discovered host" in m for m in caplog.messages) == 4, "each is logged once"


def test_crash_between_response_and_commit_converges(transactional_db, master_server, world, monkeypatch):
    client = client_for(master_server, world)
    client.tick()
    run_all_hqes_to_completion()

    def crash(job_ids: list[int]) -> None:
        raise RuntimeError("shard process died mid-commit")

    monkeypatch.setattr(ingest, "abort_queued_hqes", crash)
    with pytest.raises(RuntimeError, match="died mid-commit"):
        client.tick()
    assert OutboxEntry.objects.count() == 4, "nothing was dropped: the transaction rolled back"
    monkeypatch.undo()
    client.tick()
    assert not OutboxEntry.objects.exists()
    assert master_state(master_server, world)["applied"] == 4
    assert Job.objects.count() == 1 and HostQueueEntry.objects.count() == 2


@pytest.mark.postgres_only
def test_concurrent_heartbeats_never_deliver_a_job_twice_nor_apply_an_update_twice(
    transactional_db, master_server, world
):
    errors: list[BaseException] = []

    def race() -> None:
        barrier = threading.Barrier(2)

        def tick() -> None:
            try:
                barrier.wait(10)
                client_for(master_server, world).tick()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=tick) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    race()
    assert not errors, errors
    assert list(Job.objects.values_list("id", flat=True)) == world["jobs"]
    assert HostQueueEntry.objects.count() == 2
    run_all_hqes_to_completion()
    race()
    assert not errors, errors
    assert not OutboxEntry.objects.exists()
    state = master_state(master_server, world)
    assert state["applied"] == 4, "each of the 4 updates was applied exactly once"
    assert state["hqes"] == ["Completed", "Completed"]


@pytest.mark.parametrize("newer", ["update", "host event"])
def test_a_heartbeat_overtaken_by_a_newer_one_of_its_database_is_retried_not_taken_for_a_rollback(
    transactional_db, master_server, world, newer
):
    """Two processes of one shard database: the holder's request still on its way when the next holder
    heartbeats (elastic workers: a lost lock connection, TAKEOVER_S), or its last heartbeats sent after
    it let the lock go (shard/process.py's flush). The newer request may reach the master first; the
    older one's last_seq is then below the seq the master has seen, but the database did not go back.
    Renewing its instance id would make the master take the shard for a new database (every started
    run failed as infra, the processes stopped): the older request is retried instead."""
    client = client_for(master_server, world)
    client.tick()
    first = ShardState.objects.get().instance
    older = client.build_request()
    host_id = world["hosts"][0]
    with shard_write():
        if newer == "update":
            transition_hqe(HostQueueEntry.objects.order_by("id").first().id, "Running", host_id=host_id)
        else:
            move_host(host_id, "Repairing", held_by="", holder="me")
    client_for(master_server, world).tick()  # the other process's, built later and answered first
    assert older["last_seq"] < ShardState.objects.get().last_seq
    with pytest.raises(HeartbeatFailed) as refused:
        client.exchange(older)
    assert not isinstance(refused.value, ProtocolRefused), refused.value
    assert "overtaken" in str(refused.value)
    assert ShardState.objects.get().instance == first and client.instance == first
    client.tick()
    assert ShardState.objects.get().instance == first


def test_master_down_is_a_clear_retryable_failure(transactional_db):
    client = HeartbeatClient(f"http://127.0.0.1:{free_port()}", "lab", "fs_token")
    with pytest.raises(HeartbeatFailed, match="cannot reach the master"):
        client.tick()


def test_wrong_protocol_stops_run_shard_with_a_clear_message(
    transactional_db, master_server, world, monkeypatch, settings
):
    monkeypatch.setattr(client_module, "PROTOCOL_VERSION", 2)
    with pytest.raises(ProtocolRefused, match="protocol 2 is not supported"):
        client_for(master_server, world).tick()
    settings.ROLE = "shard"
    settings.FLEETSHARD_MASTER_URL = master_server.url
    settings.FLEETSHARD_SHARD_HOSTNAME = world["shard"]
    settings.FLEETSHARD_SHARD_TOKEN = world["token"]
    with pytest.raises(CommandError, match="stopping: the master refused protocol 2"):
        call_command("run_shard")


def test_a_wrong_token_stops_run_shard_with_the_reason(transactional_db, master_server, world, settings, caplog):
    """A revoked or wrong token is not a passing fault: retrying for ever would hide it."""
    client = HeartbeatClient(master_server.url, world["shard"], "fs_wrong")
    with pytest.raises(TokenRefused, match="401: unknown or revoked shard token"):
        client.tick()
    settings.ROLE = "shard"
    settings.FLEETSHARD_MASTER_URL = master_server.url
    settings.FLEETSHARD_SHARD_HOSTNAME = world["shard"]
    settings.FLEETSHARD_SHARD_TOKEN = "fs_wrong"
    began = time.monotonic()
    with pytest.raises(CommandError, match="stopping: the master at .* refused this shard's token \\(401"):
        call_command("run_shard")
    assert time.monotonic() - began < 30
    assert not [r for r in caplog.records if "heartbeat failed" in r.getMessage()]


@pytest.mark.postgres_only(reason="the worker manager runs only beside a shard on PostgreSQL")
def test_a_worker_manager_with_a_wrong_token_stops_with_the_reason(transactional_db, master_server, world, settings):
    settings.ROLE = "shard"
    settings.FLEETSHARD_MASTER_URL = master_server.url
    settings.FLEETSHARD_SHARD_HOSTNAME = world["shard"]
    settings.FLEETSHARD_SHARD_TOKEN = "fs_revoked"
    began = time.monotonic()
    with pytest.raises(CommandError, match="stopping: the master at .* refused this shard's token \\(401"):
        call_command("run_worker_manager", "--backend=local", "--max-workers=1", "--tick-seconds=0.5")
    assert time.monotonic() - began < 30


def test_another_shards_token_is_refused_with_the_reason(transactional_db, master_server, world):
    other = make_world(master_server, f"o{uuid.uuid4().hex[:6]}", hosts=1, jobs=0)
    client = HeartbeatClient(master_server.url, world["shard"], other["token"])
    with pytest.raises(TokenRefused, match="refused this shard's token \\(403: .*check FLEETSHARD_SHARD_TOKEN"):
        client.tick()


@pytest.mark.postgres_only(reason="stands in for a database restart by killing the shard's PostgreSQL backend")
def test_client_loop_survives_a_database_restart(transactional_db, master_server, world, settings):
    """The shard's connection is killed (as a database restart would); the loop reconnects and goes on."""
    settings.FLEETSHARD_HEARTBEAT_INTERVAL_S = 0.2
    client = client_for(master_server, world)
    stop = threading.Event()
    pids: list[int] = []

    def loop() -> None:
        try:
            client.run(stop)
        finally:
            connection.close()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        wait_until(lambda: Job.objects.filter(id__in=world["jobs"]).exists(), what="the first job")
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            pids = [row[0] for row in cur.fetchall()]
            for pid in pids:
                cur.execute("SELECT pg_terminate_backend(%s)", [pid])
        new_job = master_server.shell(
            "from master import services\n"
            f"job = services.create_job(services.JobRequest(name='after-restart', owner='ana', command='true',"
            f" meta_hosts=[('{world['label']}', 1)]), acting_user=None)\nresult = job.id"
        )
        wait_until(lambda: Job.objects.filter(id=new_job).exists(), timeout=60, what="a job after the restart")
    finally:
        stop.set()
        thread.join(30)
    assert pids, "the client's connection was open and got killed"
    assert not thread.is_alive()


def test_a_tiny_interval_from_the_master_is_floored(transactional_db, master_server, world, monkeypatch):
    """Found by the hostile review: a fake master's heartbeat_interval_s of 0.000001 spun the client."""
    client = client_for(master_server, world)
    real = client.exchange

    def tiny(body):
        return dataclasses.replace(real(body), heartbeat_interval_s=0.000001)

    monkeypatch.setattr(client, "exchange", tiny)
    client.tick()
    assert client.interval == client_module.MIN_INTERVAL_S


def test_a_nudge_cuts_the_wait_between_heartbeats_short_and_a_burst_makes_one_heartbeat():
    client = HeartbeatClient("http://127.0.0.1:9", "lab", "fs_token")
    stop = threading.Event()
    timer = threading.Timer(0.2, client.nudge.set)
    timer.start()
    began = time.monotonic()
    client.pause(stop, 10.0)
    took = time.monotonic() - began
    assert 0.2 <= took < 5.0  # cut short, well before its 10 s (with room for a loaded machine)
    assert not client.nudge.is_set()  # the burst's nudges were taken by this one wait


def test_a_stopped_client_stops_waiting():
    client = HeartbeatClient("http://127.0.0.1:9", "lab", "fs_token")
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    began = time.monotonic()
    client.pause(stop, 30.0)
    assert time.monotonic() - began < 5.0  # at once, not after its 30 s (with room for a loaded machine)


def test_a_master_that_cannot_hold_waits_leaves_the_interval_in_charge():
    """Nothing listens there: no news either way, and the watcher falls back to the interval."""
    client = HeartbeatClient(f"http://127.0.0.1:{free_port()}", "lab", "fs_token")
    session = client_module.master_session("fs_token")
    assert client.wait_for_news(session) is None
    # One short line, as every other network failure: not urllib3's chain of wrapped exceptions.
    assert client.wait_refused == f"cannot reach {client.wait_url}: connection refused"


def test_the_long_poll_ends_with_news_once_a_job_is_created_for_this_shard(transactional_db, master_server, world):
    client = client_for(master_server, world)
    client.tick()
    session = client_module.master_session(world["token"])
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append((client.wait_for_news(session), time.monotonic())))
    thread.start()
    time.sleep(0.5)
    created = time.monotonic()
    master_server.shell(
        "from master import services\n"
        f"job = services.create_job(services.JobRequest(name='news', owner='ana', command='true',"
        f" meta_hosts=[('{world['label']}', 1)]), acting_user=None)\nresult = job.id"
    )
    thread.join(40)
    assert answers and answers[0][0] is True
    assert answers[0][1] - created < 10  # the shell's own start-up is most of it


def test_a_master_answering_every_wait_at_once_cannot_spin_the_shard():
    """A master (or something posing as one) that never holds the wait gets at most one a second."""
    import http.server

    asked: list[float] = []

    class Instant(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(time.monotonic())
            body = b'{"news": false}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Instant)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = HeartbeatClient(f"http://127.0.0.1:{server.server_address[1]}", "lab", "fs_token")
    stop = threading.Event()
    watcher = threading.Thread(target=client.watch, args=(stop,))
    watcher.start()
    # Four asks, however late a loaded machine runs them, then their pace: a fixed 2.5 s window could hold
    # only one on a loaded machine. Load only stretches the gaps; a spinning watcher has none.
    wait_until(lambda: len(asked) >= 4, timeout=30, interval=0.05, what="four waits")
    stop.set()
    watcher.join(5)
    server.shutdown()
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    assert asked[3] - asked[0] >= 3 * client_module.MIN_WAIT_CYCLE_S - 0.5, gaps
    assert min(gaps) > 0.25, gaps
    assert not client.nudge.is_set()


def test_host_events_share_the_outbox_seqs_and_reach_the_masters_timeline(transactional_db, master_server, world):

    client = client_for(master_server, world)
    client.tick()
    host_id = world["hosts"][0]
    hqe = HostQueueEntry.objects.order_by("id").first()
    with shard_write():
        move_host(host_id, "Running", held_by="", holder="me")
        transition_hqe(hqe.id, "Running", host_id=host_id)
    with shard_write():
        finish_hqe(hqe.id, "Failed", failure="test", exit_code=1)
        move_host(host_id, "Repairing", held_by="me", holder="me")
    with shard_write():
        move_host(host_id, "Ready", held_by="me", holder="")
    seqs = sorted(
        [*OutboxEntry.objects.values_list("seq", flat=True), *HostEvent.objects.values_list("seq", flat=True)]
    )
    assert seqs == list(range(seqs[0], seqs[0] + 5)), "one counter numbers updates and host events"
    body = client.build_request()
    assert [e["status"] for e in body["host_events"]] == ["Running", "Repairing", "Ready"]
    client.tick()
    assert not HostEvent.objects.exists() and not OutboxEntry.objects.exists()
    kinds = master_server.shell(
        f"""
from master.timeline.models import Interval
result = list(Interval.objects.filter(host_id={host_id}).values_list("kind", "start", "end"))
"""
    )
    assert [k for k, _, _ in kinds] == ["run", "Repairing"]
    assert kinds[0][2] <= kinds[1][1] < kinds[1][2]


def test_host_events_never_overtake_updates_cut_at_the_limit(transactional_db, master_server, world, monkeypatch):

    monkeypatch.setattr(client_module, "MAX_UPDATES_PER_HEARTBEAT", 1)
    client = client_for(master_server, world)
    client.tick()
    first, second = HostQueueEntry.objects.order_by("id")[:2]
    with shard_write():
        transition_hqe(first.id, "Running", host_id=world["hosts"][0])
        early = enqueue_host_event(world["hosts"][0], "Running").seq
        transition_hqe(second.id, "Running", host_id=world["hosts"][1])
        enqueue_host_event(world["hosts"][1], "Running")
    body = client.build_request()
    assert [u["hqe"] for u in body["updates"]] == [first.id]
    assert [e["seq"] for e in body["host_events"]] == [], "the event after the update sent is held back"
    client.tick()
    assert [e["seq"] for e in client.build_request()["host_events"]] == [early]


def test_heartbeat_failures_are_one_short_line_with_the_cause(transactional_db):
    """No URL path, no urllib3 retry chain: the master's base URL and why (docs/configuration.md, "Running the
    pieces by hand")."""
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(HeartbeatFailed) as info:
        HeartbeatClient(url, "lab", "fs_token").tick()
    assert str(info.value) == f"cannot reach the master at {url}: connection refused"


def test_a_proxy_error_page_is_its_status_and_reason_not_its_html(transactional_db):
    import http.server

    class BadGateway(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>\n<body>\n<h1>502 Bad Gateway</h1>\n</body>\n</html>\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), BadGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(HeartbeatFailed) as info:
            HeartbeatClient(url, "lab", "fs_token").tick()
        assert str(info.value) == f"the master at {url} answered HTTP 502: Bad Gateway"
    finally:
        server.shutdown()
        server.server_close()


def test_a_job_end_committed_while_the_request_is_built_sends_neither_its_update_nor_its_hosts_event(
    transactional_db, master_server, world, monkeypatch
):
    """The updates and the events are two reads: a run's end and its host's Cleaning committed between
    them once sent the event alone, and the master, the run still open there, dropped the Cleaning."""
    client = client_for(master_server, world)
    client.tick()
    host_id = world["hosts"][0]
    hqe = HostQueueEntry.objects.order_by("id").first()
    with shard_write():
        move_host(host_id, "Running", held_by="", holder="me")
        transition_hqe(hqe.id, "Running", host_id=host_id)
    client.tick()
    read_updates = client_module.pending

    def pending_then_the_job_ends(limit: int) -> list[dict[str, Any]]:
        updates = read_updates(limit)
        with shard_write():
            finish_hqe(hqe.id, "Completed", exit_code=0)
            move_host(host_id, "Cleaning", held_by="me", holder="me")
        return updates

    monkeypatch.setattr(client_module, "pending", pending_then_the_job_ends)
    body = client.build_request()
    assert body["updates"] == [] and body["host_events"] == []
    monkeypatch.setattr(client_module, "pending", read_updates)
    client.tick()
    kinds = master_server.shell(
        f"""
from master.timeline.models import Interval
result = list(Interval.objects.filter(host_id={host_id}).order_by("start").values_list("kind", "end"))
"""
    )
    assert [k for k, _ in kinds] == ["run", "Cleaning"] and kinds[0][1] is not None


def test_a_shard_falling_back_to_the_interval_says_so_once_and_says_when_long_polls_are_back(caplog):
    """A master whose listener is down answers waits with 503: the shard says why, once, and keeps
    heartbeating at the interval; once waits are held again it says that too."""
    import http.server

    asked: list[float] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(time.monotonic())
            down = len(asked) <= 3
            body = b'{"error": "this master process hears no change notifications"}' if down else b'{"news": false}'
            self.send_response(503 if down else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = HeartbeatClient(f"http://127.0.0.1:{server.server_address[1]}", "lab", "fs_token")
    client.interval = 0.2
    stop = threading.Event()
    watcher = threading.Thread(target=client.watch, args=(stop,))
    with caplog.at_level("INFO", logger="shard.sync.client"):
        watcher.start()
        wait_until(lambda: len(asked) >= 5, timeout=10, what="the watcher to ask again after the fallback")
        stop.set()
        watcher.join(5)
    server.shutdown()
    fallbacks = [r for r in caplog.records if "no long-poll" in r.getMessage()]
    assert len(fallbacks) == 1 and fallbacks[0].levelname == "WARNING"
    assert "503: this master process hears no change notifications" in fallbacks[0].getMessage()
    assert sum("holds long-polls again" in r.getMessage() for r in caplog.records) == 1
