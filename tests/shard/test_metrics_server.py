"""The shard's own /metrics and /healthz (FLEETSHARD_METRICS_BIND): figures that follow a real run."""

import math
import socket
import struct
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from shard.metrics import MAX_CONCURRENT, MAX_CONNECTIONS, MetricsServer, outcome, parse_bind
from shard.sync.client import HeartbeatClient
from tests.shard.fleet import new_shard, submit, writable_by_jobs
from tests.support import assert_status, free_port, make_shard_process, wait_until

pytestmark = pytest.mark.e2e


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = requests.get(base + "/metrics", timeout=10)
    assert_status(resp, 200)
    assert resp.headers["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "shard"))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def serving(base: str, proc_alive) -> bool:
    assert proc_alive(), "run_shard exited"
    try:
        return requests.get(base + "/healthz", timeout=2).json() == {"status": "ok"}
    except requests.RequestException:
        return False


def test_metrics_follow_a_job_through_the_shard(master_server, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    shard = new_shard(master_server, tmp_path, hosts=1, FLEETSHARD_METRICS_BIND=f"127.0.0.1:{port}")
    gate = writable_by_jobs(tmp_path) / "go"
    shard.process.start()
    try:
        wait_until(lambda: serving(base, lambda: shard.process.proc.poll() is None), timeout=30, what="/healthz")
        wait_until(lambda: scrape(base)[("fleetshard_shard_accepted", ())] == 1, timeout=30, what="acceptance")
        before = scrape(base)
        assert before[("fleetshard_shard_runs_started_total", ())] == 0
        assert before[("fleetshard_shard_hosts", (("status", "Ready"),))] == 1
        assert before[("fleetshard_shard_heartbeat_failures_total", ())] == 0
        assert 0 <= before[("fleetshard_shard_heartbeat_age_seconds", ())] < 30

        waiting = f'while [ ! -e "{gate}" ]; do sleep 0.1; done'
        submit(master_server, [{"name": "held", "command": waiting, "meta_hosts": [[shard.label, 1]]}])

        def running() -> dict:
            m = scrape(base)
            return m if m[("fleetshard_shard_runs", (("state", "Running"),))] == 1 else {}

        during = wait_until(running, timeout=30, what="the job to run")
        assert during[("fleetshard_shard_runs_started_total", ())] == 1
        assert during[("fleetshard_shard_hosts", (("status", "Running"),))] == 1
        assert not any(name == "fleetshard_shard_runs_ended_total" for name, _ in during)

        gate.touch()
        submit(master_server, [{"name": "fails", "command": "exit 3", "meta_hosts": [[shard.label, 1]]}])

        def both_ended() -> dict:
            m = scrape(base)
            done = (
                m.get(("fleetshard_shard_runs_ended_total", (("outcome", "Completed"),))) == 1
                and m.get(("fleetshard_shard_runs_ended_total", (("outcome", "Failed/test"),))) == 1
            )
            return m if done and m[("fleetshard_shard_outbox_entries", ())] == 0 else {}

        after = wait_until(both_ended, timeout=60, what="both jobs to end and be acked")
        assert after[("fleetshard_shard_runs_started_total", ())] == 2
        assert after[("fleetshard_shard_runs", (("state", "Running"),))] == 0
        assert_status(requests.get(base + "/nothing", timeout=5), 404)
    finally:
        assert shard.process.stop() == 0
    with pytest.raises(requests.ConnectionError):
        requests.get(base + "/healthz", timeout=2)


def test_metrics_count_failed_heartbeats_when_the_master_is_gone(master_server, tmp_path):
    """A shard that never reached its master: alive, never heartbeated, failures counting up."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = make_shard_process(tmp_path, master_server, "lab-orphan", "no-such-token")
    process.role.extra_env.update(
        FLEETSHARD_MASTER_URL=f"http://127.0.0.1:{free_port()}",
        FLEETSHARD_METRICS_BIND=f"[::1]:{port}" if _ipv6() else f"127.0.0.1:{port}",
        FLEETSHARD_HEARTBEAT_INTERVAL_S="0.1",
    )
    if _ipv6():
        base = f"http://[::1]:{port}"
    process.start()
    try:
        wait_until(lambda: serving(base, lambda: process.proc.poll() is None), timeout=30, what="/healthz")
        m = wait_until(
            lambda: (m := scrape(base))[("fleetshard_shard_heartbeat_failures_total", ())] >= 1 and m,
            timeout=30,
            what="a failed heartbeat",
        )
        assert m[("fleetshard_shard_accepted", ())] == 0
        assert math.isinf(m[("fleetshard_shard_heartbeat_age_seconds", ())])
        assert math.isnan(m[("fleetshard_shard_last_heartbeat_ok_timestamp_seconds", ())])
    finally:
        process.stop()


def _ipv6() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_a_bad_metrics_bind_stops_run_shard_with_its_name(master_server, tmp_path):
    process = make_shard_process(tmp_path, master_server, "lab-badbind", "t", FLEETSHARD_METRICS_BIND="nowhere")
    proc = process.role.manage("run_shard", check=False, timeout=60)
    assert proc.returncode == 1
    assert "FLEETSHARD_METRICS_BIND must be HOST:PORT (e.g. 127.0.0.1:9464), not 'nowhere'" in proc.stderr


@pytest.mark.parametrize("bind", ["", ":80", "host:", "host:0", "host:70000", "host:http", "1.2.3.4"])
def test_parse_bind_refuses_what_is_not_host_port(bind):
    with pytest.raises(ValueError, match="FLEETSHARD_METRICS_BIND must be HOST:PORT"):
        parse_bind(bind)


def test_parse_bind_takes_ipv4_ipv6_and_names():
    assert parse_bind("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_bind("[::1]:9464") == ("::1", 9464)
    assert parse_bind("localhost:1") == ("localhost", 1)


def test_outcome_names_the_failure_class():
    assert [outcome("Completed", ""), outcome("Failed", "infra"), outcome("Aborted", "")] == [
        "Completed",
        "Failed/infra",
        "Aborted",
    ]


def test_more_requests_at_once_than_allowed_get_a_503_not_a_thread_each():
    client = HeartbeatClient("http://127.0.0.1:1", "lab", "token")
    port = free_port()
    server = MetricsServer(f"127.0.0.1:{port}", client, "lab")
    server.start()
    try:
        for _ in range(MAX_CONCURRENT):
            server.slots.acquire()
        busy = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert_status(busy, 503)
        assert b"busy" in busy.content
        for _ in range(MAX_CONCURRENT):
            server.slots.release()
        assert_status(requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5), 200)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def metrics_server():
    port = free_port()
    server = MetricsServer(f"127.0.0.1:{port}", HeartbeatClient("http://127.0.0.1:1", "lab", "token"), "lab")
    server.start()
    yield server, port
    server.shutdown()
    server.server_close()


def test_a_client_that_hangs_up_mid_scrape_leaves_a_log_line_not_a_traceback(db, metrics_server, capfd):
    server, port = metrics_server
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a RST
    assert_status(requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5), 200)
    time.sleep(0.5)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err


def test_connections_past_the_limit_are_closed_at_once_not_given_a_thread(metrics_server):
    server, port = metrics_server
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished: holds its thread
            idle.append(conn)
        wait_until(
            lambda: threading.active_count() >= threads_before + MAX_CONNECTIONS, timeout=10, what="the idle ones"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert extra.recv(100) == b"", "a connection past the limit was served"
        assert threading.active_count() <= threads_before + MAX_CONNECTIONS
    finally:
        for conn in idle:
            conn.close()
    wait_until(
        lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200,
        timeout=10,
        what="a slot to free",
    )
