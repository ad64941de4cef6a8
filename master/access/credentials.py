"""Token generation and lookup. Tokens are random, so a SHA-256 digest is a safe one-way store."""

import hashlib
import hmac
import secrets
import time
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db.models import Case, F, Q, When
from django.utils import timezone

from common.models import Shard
from master.access.token_cache import CACHE, Entry
from master.models import Token

TOKEN_PREFIX = "fs_"


def digest_of(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_raw_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def issue_token(*, user: User | None = None, shard: Shard | None = None, description: str = "") -> tuple[Token, str]:
    """Stores a new token's digest and returns the raw token, which is never stored nor shown again."""
    raw = new_raw_token()
    token = Token.objects.create(
        digest=digest_of(raw), prefix=raw[:10], user=user, shard=shard, description=description
    )
    return token, raw


def find_token(raw: str) -> Token | None:
    """The token matching `raw`, compared in constant time after the lookup by digest: in this
    process's token cache while it is trusted (master/access/token_cache.py), else in the database
    (and then kept in the cache, unless news of a change came while the query ran)."""
    digest = digest_of(raw)
    generation = CACHE.generation()
    if generation is not None:
        entry = CACHE.get(digest)
        if entry is None and CACHE.begin_fill(generation):
            try:
                entries = entries_in_use(digest, CACHE.size())
            except BaseException:
                CACHE.end_fill(None, generation)  # not a fill: the next miss tries again
                raise
            CACHE.end_fill(entries, generation)
            entry = next((e for e in entries if e.digest == digest), None)  # compared in constant time below
            if entry is None:
                return None
        if entry is not None and hmac.compare_digest(entry.digest, digest):
            return entry.build()
    token = Token.objects.select_related("user", "shard").filter(digest=digest).first()
    if token is None or not hmac.compare_digest(token.digest, digest):
        return None
    if generation is not None:
        CACHE.put(Entry.of(token), generation)
    return token


def entries_in_use(digest: str, limit: int) -> list[Entry]:
    """The token of `digest` (if any) and up to `limit` tokens used in the last two TOUCH_INTERVALs,
    most recently used first, as cache entries, in one query: a process whose cache was emptied (a
    start, news of a change, entries past their age) reads the fleet's tokens at once rather than
    one query for each of its first requests from each shard."""
    since = timezone.now() - 2 * TOUCH_INTERVAL
    token_names, user_names = Entry.token_names(), Entry.user_names()
    rows = (
        Token.objects.filter(Q(digest=digest) | Q(last_used__gte=since))
        .order_by(Case(When(digest=digest, then=0), default=1), F("last_used").desc(nulls_last=True))
        .values_list(*token_names, *(f"user__{n}" for n in user_names), "shard__id", "shard__hostname")[:limit]
    )
    entries = []
    read_at = time.monotonic()  # each entry's age counts from before its row was read, as MAX_AGE_S says
    for row in rows:
        token = tuple(row[: len(token_names)])
        user = tuple(row[len(token_names) : -2])
        shard = tuple(row[-2:])
        values = dict(zip(token_names, token, strict=True))
        entries.append(
            Entry(
                values["digest"],
                token,
                user if values["user_id"] is not None else None,
                shard if values["shard_id"] is not None else None,
                values["last_used"],
                read_at,
            )
        )
    return entries


# Token.last_used is for people ("is this token still in use?"), so five minutes' precision is plenty.
# Each serving process writes it for each token it sees: at a minute, 5,000 shards' tokens in five
# processes were 400 statements a second (bench/fleet.py, docs/benchmarks.md).
TOUCH_INTERVAL = timedelta(seconds=300)


def touch(token: Token, now: datetime | None = None) -> bool:
    """Records that `token` was used at `now`, at most once in TOUCH_INTERVAL; True when it wrote.

    Called on every authenticated request, so it must not write on every one: when the loaded row
    shows a use within the last minute it does nothing (no query at all), else one conditional
    UPDATE whose WHERE clause lets only the first of several concurrent requests write. The heartbeat
    (master/sync/endpoint.py) can call it with the shard token it found.
    """
    now = now or timezone.now()
    cutoff = now - TOUCH_INTERVAL
    if token.last_used is not None and token.last_used >= cutoff:
        return False
    written = (
        Token.objects.filter(pk=token.pk)
        .filter(Q(last_used__isnull=True) | Q(last_used__lt=cutoff))
        .update(last_used=now)
    )
    if written:
        token.last_used = now
    # Written now or by another request within the minute: the cached row need not try again before
    # the minute is out.
    CACHE.used(token.digest, now)
    return bool(written)
