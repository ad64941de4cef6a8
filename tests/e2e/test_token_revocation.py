"""Two real masters (`manage.py serve`) on loopback sharing one database, each with its token cache:
a token revoked through one is refused by the other at its very next request (docs/design.md, "The
token cache"), for the heartbeat and the REST API alike."""

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from common.constants import PROTOCOL_VERSION
from tests.support import Master, Role, drop_database, free_port, fresh_database_url, serve, stop, wait_until

pytestmark = pytest.mark.e2e

MAKE = """
from master import services
from master.access.credentials import digest_of
from master.models import Token
_, boss = services.create_personal_token("boss", admin=True, acting_user=None)
ana_token, ana = services.create_personal_token("ana", acting_user=None)
shard, lab1 = services.create_shard("lab1", [], acting_user=None)
kept, kept_raw = services.create_shard_token("lab1", acting_user=None)
lab1_id = Token.objects.get(digest=digest_of(lab1)).id
result = {"boss": boss, "ana": ana, "ana_id": ana_token.id, "lab1": lab1, "lab1_id": lab1_id, "kept": kept_raw,
          "kept_id": kept.id}
"""

# How many serving processes listen for changes (each trusts its token cache only while it listens).
LISTENERS = """
from django.db import connection
from master.sync import notifier
if connection.vendor == "postgresql":
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = %s AND datname = current_database()", [notifier.APPLICATION_NAME])
        result = cur.fetchone()[0]
else:
    result = len(list(notifier.socket_dir().glob("*.sock")))
"""


@pytest.fixture
def two_masters() -> Iterator[tuple[Master, Master]]:
    """Two `serve` on one database and one data directory, short enough for the SQLite listeners'
    sockets under any pytest temporary directory (a longer one leaves them deaf, and their caches unused)."""
    data_dir = Path(tempfile.mkdtemp(prefix="fs-tok-", dir="/tmp"))
    url = fresh_database_url(data_dir, "master")
    role = Role("master", url, data_dir, {})
    role.manage("migrate", "--noinput")
    masters: list[Master] = []
    try:
        for _ in range(2):
            port = free_port()
            masters.append(Master(role, f"http://127.0.0.1:{port}", serve(role, port)))
        yield masters[0], masters[1]
    finally:
        for master in masters:
            stop(master.proc)
        drop_database(url)
        shutil.rmtree(data_dir, ignore_errors=True)


def heartbeat(url: str, raw: str) -> int:
    body = {
        "protocol": PROTOCOL_VERSION,
        "shard": "lab1",
        "instance": str(uuid.uuid5(uuid.NAMESPACE_DNS, "lab1")),
        "client_version": "test",
        "known_hosts": [],
        "known_jobs": [],
        "updates": [],
    }
    resp = requests.post(f"{url}/api/v1/heartbeat", json=body, headers={"Authorization": f"Bearer {raw}"}, timeout=10)
    return resp.status_code


def rest(url: str, raw: str) -> int:
    return requests.get(f"{url}/api/v1/shards/", headers={"Authorization": f"Bearer {raw}"}, timeout=10).status_code


def test_a_token_revoked_through_one_master_is_refused_at_once_by_another(two_masters):
    one, other = two_masters
    made = one.shell(MAKE)
    # Serving before listening is possible (the listener is a thread of its own): wait for both.
    seen: list[object] = []

    def both_listen() -> bool:
        seen.append(one.shell(LISTENERS))
        return seen[-1] == 2

    try:
        wait_until(both_listen, timeout=60, interval=0.5, what="both masters to listen")
    except AssertionError:
        logs = "".join(p.read_text() for p in one.role.data_dir.glob("master*.log"))
        raise AssertionError(f"listening: {seen[-1]}\n{logs[-3000:]}") from None
    for url in (one.url, other.url):  # each process's cache learns the tokens
        for _ in range(3):
            assert heartbeat(url, made["lab1"]) == heartbeat(url, made["kept"]) == 200
            assert rest(url, made["ana"]) == 200
    # A row deleted behind every master's back (no news sent) is still accepted from the cache: the
    # other master's cache is in use, which makes what follows a test of its invalidation.
    one.shell(
        f"from master.models import Token\nresult = Token.objects.filter(id={made['kept_id']})._raw_delete('default')"
    )
    assert heartbeat(other.url, made["kept"]) == 200, "the other master's cache is not in use"

    boss = {"Authorization": f"Bearer {made['boss']}"}
    resp = requests.delete(f"{one.url}/api/v1/tokens/{made['lab1_id']}/", headers=boss, timeout=10)
    assert resp.status_code == 204
    assert heartbeat(other.url, made["lab1"]) == 401
    assert heartbeat(other.url, made["kept"]) == 401  # every cached token was forgotten

    resp = requests.delete(f"{one.url}/api/v1/tokens/{made['ana_id']}/", headers=boss, timeout=10)
    assert resp.status_code == 204
    assert rest(other.url, made["ana"]) == 401
    assert rest(one.url, made["ana"]) == 401
