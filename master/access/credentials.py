"""Token generation and lookup. Tokens are random, so a SHA-256 digest is a safe one-way store."""

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db.models import Q
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
        if entry is not None and hmac.compare_digest(entry.digest, digest):
            return entry.build()
    token = Token.objects.select_related("user", "shard").filter(digest=digest).first()
    if token is None or not hmac.compare_digest(token.digest, digest):
        return None
    if generation is not None:
        CACHE.put(Entry.of(token), generation)
    return token


# Token.last_used is for people ("is this token still in use?"), so a minute's precision is plenty.
TOUCH_INTERVAL = timedelta(seconds=60)


def touch(token: Token, now: datetime | None = None) -> bool:
    """Records that `token` was used at `now`, at most once a minute; True when it wrote.

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
