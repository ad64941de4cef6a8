"""REST API authentication with personal tokens; shard tokens are refused here (heartbeat only), but
for the one endpoint that takes them too (results upload: ResultsUploadAuthentication)."""

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from common.models import Shard
from master.access.credentials import find_token, touch


@dataclass(frozen=True)
class ShardPrincipal:
    """The caller of a request made with a shard's token: the shard, never a person."""

    shard: Shard
    is_authenticated = True
    is_active = True
    is_staff = False
    pk = None

    def get_username(self) -> str:
        return f"shard {self.shard.hostname}"


def bearer_token(header: str, schemes: Collection[str] = ("bearer",)) -> str | None:
    """The raw token of an `Authorization: <scheme> <token>` header; None when it is not one.

    The REST API also takes DRF's usual "Token" scheme; the heartbeat takes only Bearer (docs/protocol.md).
    """
    scheme, _, raw = header.partition(" ")
    raw = raw.strip()
    return raw if raw and scheme.lower() in schemes else None


class PersonalTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"
    shard_tokens = False

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        raw = bearer_token(header, schemes=("bearer", "token"))
        if raw is None:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        token = find_token(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        if token.shard is not None and self.shard_tokens:
            touch(token)
            return ShardPrincipal(token.shard), token
        user = token.user
        if user is None:
            raise exceptions.AuthenticationFailed("a shard token is only valid for the heartbeat")
        if not user.is_active:
            raise exceptions.AuthenticationFailed("the token's user is inactive")
        touch(token)  # the admin shows last_used; written at most every 5 minutes
        return user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class ResultsUploadAuthentication(PersonalTokenAuthentication):
    """A person's token or a shard's: a shard uploads the result files of its own HQEs."""

    shard_tokens = True
