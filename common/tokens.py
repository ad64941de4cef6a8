"""Token generation and lookup. Tokens are random, so a SHA-256 digest is a safe one-way store."""

import hashlib
import hmac
import secrets

from django.utils import timezone

from common.models import Token

TOKEN_PREFIX = "fs_"


def digest_of(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_raw_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def issue_token(*, user=None, shard=None, description: str = "") -> tuple[Token, str]:  # noqa: ANN001
    """Stores a new token's digest and returns the raw token, which is never stored nor shown again."""
    raw = new_raw_token()
    token = Token.objects.create(
        digest=digest_of(raw), prefix=raw[:10], user=user, shard=shard, description=description
    )
    return token, raw


def find_token(raw: str) -> Token | None:
    """The token matching `raw`, compared in constant time after the indexed lookup by digest."""
    digest = digest_of(raw)
    token = Token.objects.select_related("user", "shard").filter(digest=digest).first()
    if token is None or not hmac.compare_digest(token.digest, digest):
        return None
    return token


def touch(token: Token) -> None:
    Token.objects.filter(pk=token.pk).update(last_used=timezone.now())
