"""The token cache (master/access/token_cache.py): used only while this process's listener hears, emptied
by every change to a token, a user or a shard, never filled with a row read before such a change."""

import os
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from master import services
from master.access.credentials import digest_of, find_token, touch
from master.access.token_cache import CACHE, MAX_AGE_S, Entry, TokenCache
from master.models import Token
from master.sync import notifier
from tests.master.sync.test_heartbeat import QUERIES_PER_QUIET_HEARTBEAT
from tests.support import assert_status, wait_until


@pytest.fixture
def cached(settings, news_listener):
    """The cache on, and this process's listener hearing, as in a `serve` worker."""
    settings.FLEETSHARD_TOKEN_CACHE = 1000
    wait_until(lambda: CACHE.generation() is not None, timeout=10, interval=0.02, what="the listener")
    CACHE.invalidate()
    return CACHE


def api(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def lookup_queries(raw: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert find_token(raw) is not None
    return len(ctx.captured_queries)


def test_a_fill_that_began_before_news_is_dropped_and_a_cache_not_hearing_is_not_used(fleet, settings):
    settings.FLEETSHARD_TOKEN_CACHE = 2
    cache = TokenCache()
    token = Token.objects.select_related("user", "shard").get(shard=fleet.lab1)
    entry = Entry.of(token)
    assert cache.generation() is None and not cache.put(entry, 0)  # never heard: never used
    cache.hearing(True)
    generation = cache.generation()
    assert generation is not None
    cache.invalidate()  # news came while the row was read
    assert not cache.put(entry, generation) and cache.get(token.digest) is None
    assert cache.put(entry, cache.generation() or 0) and cache.get(token.digest) is entry
    cache.hearing(False)  # the listener lost its connection: nothing kept, nothing used
    assert cache.get(token.digest) is None and cache.generation() is None and len(cache) == 0
    cache.hearing(True)
    for digest in ("a", "b", "c"):
        cache.put(Entry(digest, entry.token, None, entry.shard, None), cache.generation() or 0)
    assert len(cache) == 2 and cache.get("a") is None  # bounded: the least recently used goes


def test_an_entry_is_used_for_at_most_its_max_age_whatever_the_listener_says(fleet, settings):
    """News a process missed without knowing (a connection dropped in silence, an older master's
    change) is bounded by the entry's age."""
    settings.FLEETSHARD_TOKEN_CACHE = 10
    token, _ = services.create_shard_token("lab1", acting_user=None)
    cache = TokenCache()
    cache.hearing(True)
    entry = Entry.of(Token.objects.select_related("user", "shard").get(pk=token.pk))
    assert cache.put(entry, cache.generation() or 0) and cache.get(token.digest) is entry
    entry.kept_at = time.monotonic() - MAX_AGE_S
    assert cache.get(token.digest) is None and len(cache) == 0


def test_a_forked_child_does_not_trust_its_parents_cache(settings):
    settings.FLEETSHARD_TOKEN_CACHE = 10
    cache = TokenCache()
    cache.hearing(True)
    cache._hearing_pid = os.getpid() + 1  # what a fork's child sees of its parent's listener
    assert cache.generation() is None


def test_a_cached_lookup_costs_no_query_and_builds_the_same_token(fleet, cached):
    raw = fleet.token1
    assert lookup_queries(raw) == 1
    assert lookup_queries(raw) == 0
    token = find_token(raw)
    assert token is not None and token.shard is not None
    assert (token.shard.id, token.shard.hostname, token.digest) == (fleet.lab1.id, "lab1", digest_of(raw))
    assert find_token(raw + "x") is None and find_token(raw + "x") is None  # misses are not kept
    assert len(cached) == 1


def test_a_cached_personal_token_builds_its_user_without_the_password_hash(fleet, cached):
    _, raw = services.create_personal_token("ana", acting_user=None)
    services.set_password("ana", "a long passphrase of ana's", acting_user=None)
    assert lookup_queries(raw) == 1 and lookup_queries(raw) == 0
    token = find_token(raw)
    assert token is not None and token.user is not None and token.shard is None
    assert (token.user.username, token.user.is_active) == ("ana", True)
    assert "password" in token.user.get_deferred_fields()
    assert User.objects.get(username="ana").password.split("$")[-1] not in repr(cached._entries)


def test_touch_writes_once_a_minute_and_the_cache_learns_it(fleet, cached):
    raw = fleet.token1
    token = find_token(raw)
    assert token is not None and touch(token)
    token = find_token(raw)
    assert token is not None and token.last_used is not None
    with CaptureQueriesContext(connection) as ctx:
        assert not touch(token)
    assert len(ctx.captured_queries) == 0
    assert Token.objects.get(id=token.id).last_used == token.last_used


def test_a_cached_quiet_heartbeat_costs_one_query_fewer(fleet, cached, heartbeat, db_vendor):
    known = heartbeat(fleet.lab1, fleet.token1)
    quiet = {"known_hosts": [{"id": h["id"], "version": h["version"], "status": "Ready"} for h in known["hosts"]]}
    quiet["known_jobs"] = [{"id": j["id"], "version": j["version"]} for j in known["jobs"]]
    heartbeat(fleet.lab1, fleet.token1, **quiet)
    with CaptureQueriesContext(connection) as ctx:
        heartbeat(fleet.lab1, fleet.token1, **quiet)
    assert len(ctx.captured_queries) == QUERIES_PER_QUIET_HEARTBEAT[db_vendor] - 1


def test_a_cached_rest_request_costs_one_query_fewer(fleet, cached, django_assert_num_queries):
    raw = services.create_personal_token("boss", admin=True, acting_user=None)[1]
    assert_status(api(raw).get("/api/v1/audit/?limit=2"), 200)
    # The count; the page; the targets of the page's records (the token with its user is cached).
    with django_assert_num_queries(3):
        assert_status(api(raw).get("/api/v1/audit/?limit=2"), 200)


def test_a_revoked_token_is_refused_at_the_next_request(fleet, cached, heartbeat):
    personal, raw = services.create_personal_token("boss", admin=True, acting_user=None)  # a user's change
    heartbeat(fleet.lab1, fleet.token1)
    assert_status(api(raw).get("/api/v1/shards/"), 200)
    assert len(cached) == 2
    shard_token = Token.objects.get(shard=fleet.lab1)
    services.revoke_token(shard_token.id, acting_user=None)
    resp = heartbeat(fleet.lab1, fleet.token1, expect=401)
    assert resp["error"] == "unknown or revoked shard token"
    assert_status(api(raw).get("/api/v1/shards/"), 200)
    services.revoke_token(personal.id, acting_user=None)
    assert_status(api(raw).get("/api/v1/shards/"), 401)


def test_a_deactivated_user_and_a_deleted_shard_are_refused_at_the_next_request(fleet, cached, heartbeat):
    _, raw = services.create_personal_token("ana", acting_user=None)
    assert_status(api(raw).get("/api/v1/shards/"), 200)
    heartbeat(fleet.lab2, fleet.token2)
    user = User.objects.get(username="ana")
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert api(raw).get("/api/v1/shards/").json()["error"] == "the token's user is inactive"
    fleet.lab2.delete()
    heartbeat(fleet.lab2, fleet.token2, expect=401)


def test_a_login_or_a_heartbeat_does_not_empty_the_cache(fleet, cached, heartbeat):
    _, raw = services.create_personal_token("ana", acting_user=None)
    assert_status(api(raw).get("/api/v1/shards/"), 200)
    heartbeat(fleet.lab1, fleet.token1)
    user = User.objects.get(username="ana")
    user.save(update_fields=["last_login"])
    assert lookup_queries(raw) == lookup_queries(fleet.token1) == 0


@pytest.mark.postgres_only(reason="a change's news is a NOTIFY sent in its transaction on PostgreSQL")
def test_the_news_is_sent_in_the_changing_transaction(fleet, cached):
    token = Token.objects.get(shard=fleet.lab1)
    with CaptureQueriesContext(connection) as ctx:
        services.revoke_token(token.id, acting_user=None)
    assert sum("pg_notify" in q["sql"] and notifier.TOKENS_PAYLOAD in q["sql"] for q in ctx.captured_queries) == 1


@pytest.mark.postgres_only(reason="terminates the listener's PostgreSQL connection, as a database restart does")
def test_a_change_missed_while_the_listener_was_down_is_not_served_from_the_cache(fleet_committed, cached):
    """A token deleted behind the signals' back (as by a master whose news was lost) while the listener
    was down: the cache, emptied when the listener came back, cannot hold it."""
    raw = fleet_committed.token1
    assert lookup_queries(raw) == 1 and lookup_queries(raw) == 0
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
            " AND pid <> pg_backend_pid() AND datname = current_database()",
            [notifier.APPLICATION_NAME],
        )
    wait_until(lambda: CACHE.generation() is None, timeout=5, interval=0.01, what="the listener to notice")
    assert lookup_queries(raw) == 1  # not trusted: the database answers
    with connection.cursor() as cur:
        cur.execute("DELETE FROM master_token WHERE digest = %s", [digest_of(raw)])
    wait_until(lambda: CACHE.generation() is not None, timeout=10, interval=0.02, what="the listener to reconnect")
    assert find_token(raw) is None
