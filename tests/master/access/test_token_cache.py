"""The token cache (master/access/token_cache.py): used only while this process's listener hears, emptied
by every change to a token, a user or a shard, never filled with a row read before such a change."""

import os
import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from master import services
from master.access import token_cache
from master.access.credentials import digest_of, entries_in_use, find_token, touch
from master.access.token_cache import CACHE, MAX_AGE_S, Entry, TokenCache
from master.models import Token
from master.sync import notifier
from tests.master.sync.test_heartbeat import QUERIES_PER_QUIET_HEARTBEAT
from tests.support import assert_status, wait_until


@pytest.fixture
def cached(settings, news_listener, monkeypatch):
    """The cache on, and this process's listener hearing, as in a `serve` worker; fills as often as news
    comes (the gap between fills has a test of its own)."""
    settings.FLEETSHARD_TOKEN_CACHE = 1000
    monkeypatch.setattr(token_cache, "FILL_GAP_S", 0.0)
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


def shards_in_use(n: int, *, minutes_ago: float = 1.0) -> list[str]:
    """`n` new shards whose tokens were used `minutes_ago` (the newest first); their raw tokens."""
    raws = []
    for i in range(n):
        shard, raw = services.create_shard(f"inuse{i}.lab", [], acting_user=None)
        Token.objects.filter(shard=shard).update(last_used=timezone.now() - timedelta(minutes=minutes_ago + i))
        raws.append(raw)
    return raws


def test_the_first_lookup_after_news_reads_every_token_in_use_in_that_one_query(fleet, cached):
    """A process whose cache was emptied (a start, news of a change) would otherwise ask the database
    once for each shard's first request to it: at 5,000 shards and five processes, 25,000 queries."""
    raws = shards_in_use(5)
    _, personal = services.create_personal_token("ana", acting_user=None)
    Token.objects.filter(user__username="ana").update(last_used=timezone.now())
    cached.invalidate()
    assert lookup_queries(raws[2]) == 1
    assert [lookup_queries(raw) for raw in [*raws, personal]] == [0] * 6
    assert lookup_queries(fleet.token1) == 1  # not used lately: read on its own, as before
    assert lookup_queries(fleet.token1) == 0
    assert find_token(raws[0] + "x") is None and len(cached) == 7  # a miss reads no fill again, keeps nothing


def test_a_fill_reads_the_same_rows_a_lookup_does(fleet, cached):
    raws = shards_in_use(1)
    _, personal = services.create_personal_token("ana", acting_user=None)
    Token.objects.filter(user__username="ana").update(last_used=timezone.now())
    filled = {e.digest: e for e in entries_in_use("none", 100)}
    for raw in (raws[0], personal):
        one = Entry.of(Token.objects.select_related("user", "shard").get(digest=digest_of(raw)))
        got = filled[one.digest]
        assert (got.token, got.user, got.shard, got.last_used) == (one.token, one.user, one.shard, one.last_used)


def test_a_fills_entries_are_as_old_as_its_query(fleet, cached):
    """MAX_AGE_S bounds how long a row is used after it was read: building 20,000 entries takes about
    100 ms, which must not be added to the last ones' lives."""
    shards_in_use(3)
    issued: list[float] = []

    def clock(execute, sql, params, many, context):
        issued.append(time.monotonic())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(clock):
        entries = entries_in_use("none", 10)
    assert len(issued) == 1 and len(entries) == 3 and all(e.kept_at <= issued[0] for e in entries)


def test_a_fill_holds_the_token_looked_up_and_the_most_recently_used_up_to_the_cache_size(fleet, cached, settings):
    settings.FLEETSHARD_TOKEN_CACHE = 3
    raws = shards_in_use(6)
    assert lookup_queries(raws[-1]) == 1  # the least recently used of the six
    assert list(cached._entries) == [digest_of(raw) for raw in (raws[1], raws[0], raws[-1])]


def test_a_fill_is_read_again_once_it_is_past_its_max_age_and_news_during_it_drops_it(fleet, cached):
    raws = shards_in_use(3)
    assert lookup_queries(raws[0]) == 1 and len(cached) == 3
    generation = cached.generation()
    assert generation is not None and not cached.begin_fill(generation)  # filled: not again so soon
    for entry in cached._entries.values():
        entry.kept_at -= MAX_AGE_S
    cached._filled = (generation, time.monotonic() - MAX_AGE_S)
    assert lookup_queries(raws[1]) == 1 and len(cached) == 3  # all past their age: read again at once
    cached.invalidate()
    generation = cached.generation()
    assert generation is not None and cached.begin_fill(generation)
    assert not cached.begin_fill(generation)  # one thread fills at a time
    entries = entries_in_use(digest_of(raws[0]), 10)
    cached.invalidate()  # news came while the rows were read
    assert not cached.end_fill(entries, generation) and len(cached) == 0
    assert cached.begin_fill(cached.generation() or 0)  # the dropped fill is tried again


def test_news_within_the_fill_gap_is_read_token_by_token_and_filled_after_it(fleet, cached, monkeypatch):
    """A script revoking a token a second: each process fills at most once a FILL_GAP_S, not at every
    change; meanwhile each miss reads its one token, and a revoked token is refused all the same."""
    monkeypatch.setattr(token_cache, "FILL_GAP_S", 60.0)
    raws = shards_in_use(3)
    cached._fill_began = None
    assert lookup_queries(raws[0]) == 1 and len(cached) == 3  # the fill
    token = Token.objects.get(digest=digest_of(raws[1]))
    services.revoke_token(token.id, acting_user=None)  # news: the cache is emptied
    assert len(cached) == 0
    assert find_token(raws[1]) is None
    assert lookup_queries(raws[0]) == 1 and len(cached) == 1  # within the gap: that token alone
    assert lookup_queries(raws[2]) == 1 and len(cached) == 2
    assert lookup_queries(raws[0]) == 0
    cached.invalidate()
    cached._fill_began = time.monotonic() - 60.0  # the gap has passed
    assert lookup_queries(raws[0]) == 1 and len(cached) == 2  # a fill again, without the revoked token
    assert lookup_queries(raws[2]) == 0


def test_a_fill_that_fails_is_tried_again_at_the_next_miss(fleet, cached):
    """A fill that raised (the database restarting, a statement cancelled) read nothing: it must not
    count as this generation's fill, or each shard's first request would ask on its own for MAX_AGE_S."""
    raws = shards_in_use(3)
    failed = []

    def lost(execute, sql, params, many, context):
        if not failed:
            failed.append(sql)
            raise OperationalError("terminating connection due to administrator command")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(lost), pytest.raises(OperationalError):
        find_token(raws[0])
    assert failed and len(cached) == 0 and cached._filling is None
    assert lookup_queries(raws[0]) == 1
    assert [lookup_queries(raw) for raw in raws[1:]] == [0, 0]


def test_a_fill_of_a_generation_gone_does_not_hold_up_the_next_ones(fleet, cached):
    """A fill still reading when news came (or one a forked child inherits from its parent's thread,
    which did not survive the fork) is dropped at its end; the new generation is filled meanwhile."""
    raws = shards_in_use(2)
    generation = cached.generation()
    assert generation is not None and cached.begin_fill(generation)
    cached.invalidate()
    assert lookup_queries(raws[0]) == 1 and lookup_queries(raws[1]) == 0
    assert not cached.end_fill(entries_in_use(digest_of(raws[0]), 10), generation) and len(cached) == 2
    now = cached.generation()
    assert now is not None and not cached.begin_fill(now)  # filled in this generation already


def test_a_first_lookup_of_a_token_never_used_is_in_its_fill_whatever_the_limit(fleet, cached, settings):
    settings.FLEETSHARD_TOKEN_CACHE = 2
    shards_in_use(4)
    assert Token.objects.get(shard=fleet.lab1).last_used is None
    assert lookup_queries(fleet.token1) == 1
    assert next(reversed(cached._entries)) == digest_of(fleet.token1) and len(cached) == 2
    assert find_token(fleet.token1 + "x") is None


def test_a_revocation_committed_while_another_thread_reads_a_fill_is_not_kept(fleet_committed, cached):
    """The fill's rows were read before the revocation committed; its news came (this process's own
    at once, as another master's would through the listener) before the fill ended: nothing is kept,
    and the revoked token is refused at its next request."""
    raws = shards_in_use(2)
    read, go = threading.Event(), threading.Event()
    found: list[Token | None] = []

    def pause_after_the_fill(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "CASE WHEN" in sql and not read.is_set():
            read.set()
            assert go.wait(10)
        return result

    def lookup() -> None:
        try:
            with connection.execute_wrapper(pause_after_the_fill):
                found.append(find_token(raws[0]))
        finally:
            connection.close()

    thread = threading.Thread(target=lookup)
    thread.start()
    assert read.wait(10)
    services.revoke_token(Token.objects.get(digest=digest_of(raws[1])).id, acting_user=None)
    go.set()
    thread.join(10)
    assert not thread.is_alive() and found and found[0] is not None  # its own request, read before
    assert len(cached) == 0  # (the listener's news of it, if it comes later, only empties it again)
    assert find_token(raws[1]) is None and find_token(raws[0]) is not None


def test_a_forked_child_does_not_trust_its_parents_cache(settings):
    settings.FLEETSHARD_TOKEN_CACHE = 10
    cache = TokenCache()
    cache.hearing(True)
    generation = cache.generation()
    assert generation is not None and cache.begin_fill(generation)  # a parent's thread reads a fill
    cache._hearing_pid = os.getpid() + 1  # what a fork's child sees of its parent's listener
    assert cache.generation() is None and not cache.begin_fill(generation)
    cache.hearing(True)  # the child's own listener: the fill its parent's thread began holds up none
    assert cache.begin_fill(cache.generation() or 0)


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


def test_the_fill_after_news_refuses_a_revoked_token_a_deactivated_user_and_a_renamed_shard(fleet, cached):
    """Each change's news empties the cache, and the fill read after it (one query, for whichever token
    comes first) holds the rows as they now are: no token of the old rows survives in it."""
    raws = shards_in_use(2)
    _, personal = services.create_personal_token("ana", acting_user=None)
    Token.objects.filter(user__username="ana").update(last_used=timezone.now())
    cached.invalidate()
    assert lookup_queries(raws[0]) == 1 and len(cached) == 3
    services.revoke_token(Token.objects.get(digest=digest_of(raws[1])).id, acting_user=None)
    with CaptureQueriesContext(connection) as ctx:
        assert find_token(raws[1]) is None
    assert len(ctx.captured_queries) == 1 and len(cached) == 2  # the fill, without the revoked token
    user = User.objects.get(username="ana")
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert lookup_queries(raws[0]) == 1
    token = find_token(personal)
    assert token is not None and token.user is not None and not token.user.is_active
    assert_status(api(personal).get("/api/v1/shards/"), 401)
    shard = Token.objects.select_related("shard").get(digest=digest_of(raws[0])).shard
    assert shard is not None
    shard.hostname = "renamed.lab"
    shard.save(update_fields=["hostname"])
    token = find_token(raws[0])
    assert token is not None and token.shard is not None and token.shard.hostname == "renamed.lab"
    shard.delete()
    with CaptureQueriesContext(connection) as ctx:
        assert find_token(raws[0]) is None
    assert len(ctx.captured_queries) == 1


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
