"""A served master (`manage.py serve`, its work slots' persistent connections) whose database
connections are all killed between heartbeats, as a database restart or an operator's
pg_terminate_backend does: the next heartbeats answer, quiet ones (statements prepared once per
connection) and ones with updates alike, and no update is applied twice."""

import uuid

import psycopg2
import pytest
import requests

from tests.support import assert_status, make_world, using_postgres

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not using_postgres(), reason="killing a connection's backend is PostgreSQL's (SQLite has no server)"
    ),
]


def _kill_every_connection(url: str) -> int:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def test_a_served_master_whose_connections_were_killed_answers_the_next_heartbeats_and_applies_each_update_once(
    own_master,
):
    world = make_world(own_master, "killed", hosts=1, jobs=1)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {world['token']}"
    instance = str(uuid.uuid4())

    def heartbeat(**extra):
        body = {"protocol": 1, "shard": world["shard"], "instance": instance, **extra}
        resp = session.post(f"{own_master.url}/api/v1/heartbeat", json=body, timeout=30)
        assert_status(resp, 200)
        return resp.json()

    first = heartbeat()
    known = {
        "known_hosts": [{"id": h["id"], "version": h["version"], "status": "Ready"} for h in first["hosts"]],
        "known_jobs": [{"id": j["id"], "version": j["version"]} for j in first["jobs"]],
    }
    for _ in range(3):
        assert heartbeat(**known)["jobs"] == []  # quiet: prepares on whichever slot's connection
    hqe = first["jobs"][0]["hqes"][0]["id"]
    running = {"seq": 1, "hqe": hqe, "status": "Running", "host": first["hosts"][0]["id"]}
    for _ in range(3):
        assert _kill_every_connection(own_master.role.database_url) >= 1
        for _ in range(3):
            assert heartbeat(**known)["acks"] == []
        assert heartbeat(**known, updates=[running])["acks"] == [{"seq": 1, "result": "accepted"}]
    applied = own_master.shell(
        f"from common.models import HostQueueEntry, Shard\n"
        f"h = HostQueueEntry.objects.get(id={hqe})\n"
        f"result = [h.status, h.last_seq, Shard.objects.get(id={world['shard_id']}).updates_applied]"
    )
    assert applied == ["Running", 1, 1]
