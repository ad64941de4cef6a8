"""REST API authentication with personal tokens; shard tokens are refused here (heartbeat only)."""

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from master.tokens import find_token, touch


class PersonalTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not raw.strip():
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        token = find_token(raw.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        if token.user_id is None:
            raise exceptions.AuthenticationFailed("a shard token is only valid for the heartbeat")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("the token's user is inactive")
        touch(token)  # the admin shows last_used; written at most once a minute
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
