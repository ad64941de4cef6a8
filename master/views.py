"""The heartbeat endpoint: authenticate, parse, hand to master.heartbeat, render. Errors change nothing."""

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import Error as DatabaseFailure
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from common.wire import HeartbeatRequest, ProtocolMismatch, WireError, error_body, loads
from master.auth import bearer_token
from master.heartbeat import InstanceConflict, process_heartbeat
from master.tokens import find_token, touch

log = logging.getLogger(__name__)


def _error(status: int, message: str, field: str | None = None, **detail: object) -> JsonResponse:
    return JsonResponse(error_body(message, field, **detail), status=status)


def _unavailable(exc: Exception) -> JsonResponse:
    """A lost connection or a restarting database: the transaction rolled back and the shard retries."""
    log.warning("heartbeat: database unavailable: %s", exc)
    return _error(503, "the master's database is unavailable; retry", None)


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    try:
        raw_body = request.body
    except RequestDataTooBig:
        return _error(413, "request body is larger than 10 MiB", "body")

    raw_token = bearer_token(request.headers.get("Authorization", ""))
    if raw_token is None:
        return _error(401, "missing shard token: send 'Authorization: Bearer <shard token>'", "Authorization")
    try:
        token = find_token(raw_token)
    except DatabaseFailure as exc:
        return _unavailable(exc)
    if token is None:
        return _error(401, "unknown or revoked shard token", "Authorization")

    try:
        req = HeartbeatRequest.parse(loads(raw_body))
    except ProtocolMismatch as exc:
        return _error(409, exc.message, exc.field, supported=[1])
    except WireError as exc:
        return _error(400, f"invalid heartbeat: {exc}", exc.field)

    if token.shard is None:
        return _error(403, "a personal token cannot heartbeat; use the shard's token", "Authorization")
    if token.shard.hostname != req.shard:
        log.warning("heartbeat for shard %r with the token of shard %s refused", req.shard, token.shard.hostname)
        return _error(403, f"this token belongs to another shard than {req.shard}", "shard")

    try:
        touch(token)
        response = process_heartbeat(token.shard.id, req)
    except InstanceConflict as exc:
        return _error(409, exc.message, "instance", heard_s_ago=round(exc.heard_s_ago, 1))
    except DatabaseFailure as exc:
        return _unavailable(exc)
    return JsonResponse(response.to_wire())
