"""A per-process cache of the tokens that authenticated lately, so that a heartbeat or a REST request
with a known token costs no query to find it (docs/design.md, "The token cache").

It is trusted only while this process hears every change to tokens, users and shards: the change
listener (master/sync/notifier.py) says when it starts hearing (`hearing(True)`) and when it may have
stopped (`hearing(False)`), and passes on each change it hears (`invalidate`). Each of those empties the
cache and bumps its generation, and a lookup fills the cache only if the generation it saw before its
query is still the current one: a row read before a revocation committed never lands in the cache after
the news of that revocation came. A process that never listens (tests, management commands) always asks
the database.

Only what authentication needs is kept, as plain values, and fresh model instances are built from them
for each request (nothing is shared between requests): the token's row, its user's row but the password
hash, and of its shard
only the id and hostname (every other field of the shard is left deferred, so it is read from the
database if anything asks). Keys are the tokens' SHA-256 digests, as in the database; nothing else of
a token is kept.
"""

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS

from common.models import Shard
from master.models import Token

# What of a shard a cached token keeps: the heartbeat and ShardPrincipal need no more (every other
# field changes with each heartbeat and is read from the database when asked for).
SHARD_FIELDS = ("id", "hostname")


# However sure the listener is, an entry is used for at most this long: it bounds what news a process
# could miss without knowing (a listening connection dropped in silence is noticed only within about
# 15 s; a master of an older release, during a rolling upgrade, sends no news of its changes). Not
# shorter: each process reads each token it sees again after it, and a shard's 8 requests a minute
# spread over five processes reach each about twice a minute, so at 60 s about every other lookup
# went to the database (heartbeat capacity at a million hosts: 348/s at 60 s, 450-462/s at 300 s).
MAX_AGE_S = 300.0

# At most one fill a process begins in this many seconds, whatever news comes: a script revoking a
# token a second would otherwise have every process read every token in use (some 200 ms at 20,000)
# every second. A miss within it reads its one token, as a process without fills would.
FILL_GAP_S = 5.0

# Not kept of a user: its password hash (a token is not a password; read if anything asks for it).
USER_UNCACHED = ("password",)


def _names(model: Any) -> tuple[str, ...]:
    skip = USER_UNCACHED if model is get_user_model() else ()
    return tuple(f.attname for f in model._meta.concrete_fields if f.attname not in skip)


def _values(instance: Any) -> tuple[Any, ...]:
    return tuple(getattr(instance, name) for name in _names(type(instance)))


def _build(model: Any, values: tuple[Any, ...], names: tuple[str, ...] | None = None) -> Any:
    return model.from_db(DEFAULT_DB_ALIAS, list(names or _names(model)), list(values))


@dataclass
class Entry:
    """A token's row and its owner's, as the lookup read them."""

    digest: str
    token: tuple[Any, ...]
    user: tuple[Any, ...] | None
    shard: tuple[Any, ...] | None
    last_used: datetime | None
    kept_at: float = field(default_factory=time.monotonic)  # when it was read from the database

    @classmethod
    def of(cls, token: Token) -> "Entry":
        user = _values(token.user) if token.user is not None else None
        shard = (token.shard.id, token.shard.hostname) if token.shard is not None else None
        return cls(token.digest, _values(token), user, shard, token.last_used)

    @staticmethod
    def token_names() -> tuple[str, ...]:
        """The token row's columns, in the order `token` holds them."""
        return _names(Token)

    @staticmethod
    def user_names() -> tuple[str, ...]:
        return _names(get_user_model())

    def build(self) -> Token:
        """A new Token, with its user or shard, as find_token returns them."""
        token: Token = _build(Token, self.token)
        token.last_used = self.last_used
        token.user = _build(get_user_model(), self.user) if self.user is not None else None
        token.shard = _build(Shard, self.shard, SHARD_FIELDS) if self.shard is not None else None
        return token


class TokenCache:
    """Token digest → Entry, the least recently used dropped beyond `size` entries; one per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._generation = 0
        # The process whose listener hears every change; None while none is sure to (a fork's child
        # inherits the parent's value, and must not trust it).
        self._hearing_pid: int | None = None
        # The generation and time of the last fill (every token in use, read in one query), and the
        # generation of the one a thread is reading now: a fill of a generation gone (news came while
        # it read; a forked child's, whose thread did not survive the fork) holds up no later one.
        self._filled: tuple[int, float] | None = None
        self._filling: int | None = None
        self._fill_began: float | None = None

    @staticmethod
    def size() -> int:
        return int(getattr(settings, "FLEETSHARD_TOKEN_CACHE", 0))

    def enabled(self) -> bool:
        return self.size() > 0

    def trusted(self) -> bool:
        return self._hearing_pid == os.getpid() and self.enabled()

    def __len__(self) -> int:
        return len(self._entries)

    def generation(self) -> int | None:
        """The generation to hand back to `put` after a lookup; None when the cache must not be used."""
        with self._lock:
            return self._generation if self.trusted() else None

    def get(self, digest: str) -> Entry | None:
        with self._lock:
            if not self.trusted():
                return None
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if time.monotonic() - entry.kept_at >= MAX_AGE_S:
                del self._entries[digest]
                return None
            self._entries.move_to_end(digest)
            return entry

    def put(self, entry: Entry, generation: int) -> bool:
        """Keeps `entry`, read from the database after `generation` was current; False (dropped) when
        news came since, since the row may have been read before the change it announced committed."""
        size = self.size()
        with self._lock:
            if generation != self._generation or not self.trusted():
                return False
            self._entries[entry.digest] = entry
            self._entries.move_to_end(entry.digest)
            while len(self._entries) > size:
                self._entries.popitem(last=False)
            return True

    def begin_fill(self, generation: int) -> bool:
        """Whether this lookup should read every token in use along with its own: True once a
        generation and MAX_AGE_S, to one thread at a time and at most once in FILL_GAP_S; end_fill
        must follow."""
        with self._lock:
            if generation != self._generation or not self.trusted() or self._filling == generation:
                return False
            filled = self._filled
            now = time.monotonic()
            if filled is not None and filled[0] == generation and now - filled[1] < MAX_AGE_S:
                return False
            if self._fill_began is not None and now - self._fill_began < FILL_GAP_S:
                return False
            self._filling, self._fill_began = generation, now
            return True

    def end_fill(self, entries: list[Entry] | None, generation: int) -> bool:
        """Keeps what a fill read after `generation` was current, as `put` keeps one entry; None: the
        fill failed (a database error), and the next miss tries again."""
        size = self.size()
        with self._lock:
            if self._filling == generation:
                self._filling = None
                if entries is None:
                    self._fill_began = None  # it read nothing: the next miss tries again
            if entries is None or generation != self._generation or not self.trusted():
                return False
            for entry in reversed(entries[:size]):  # the first (the one looked up) ends most recent
                self._entries[entry.digest] = entry
                self._entries.move_to_end(entry.digest)
            while len(self._entries) > size:
                self._entries.popitem(last=False)
            self._filled = (generation, min((e.kept_at for e in entries), default=time.monotonic()))
            return True

    def used(self, digest: str, when: datetime) -> None:
        """The token's last_used is known to be `when` or later (touch wrote it, or another did)."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and (entry.last_used is None or entry.last_used < when):
                entry.last_used = when

    def invalidate(self) -> None:
        """A token, user or shard changed somewhere: forget everything, and any fill under way."""
        with self._lock:
            self._entries.clear()
            self._generation += 1

    def hearing(self, sure: bool) -> None:
        """The listener (re)connected (`sure`), or may miss changes from now on: either way what is
        kept may be stale."""
        with self._lock:
            self._entries.clear()
            self._generation += 1
            if sure and self._hearing_pid != os.getpid():
                self._fill_began = None  # a listener (re)connected, or a fork's child's: fill at once
            self._hearing_pid = os.getpid() if sure else None


CACHE = TokenCache()
