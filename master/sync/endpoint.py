"""The heartbeat endpoint and its long-poll: authenticate, parse, hand to master.sync.heartbeat or
master.sync.notifier, render. Errors change nothing."""

import logging
import math
import socket
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import Error as DatabaseFailure
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from common.admission import work_slot
from common.wire import HeartbeatRequest, ProtocolMismatch, WireError, dumps, error_body, loads
from master.access.authentication import bearer_token
from master.access.credentials import find_token, touch
from master.models import Token
from master.sync.heartbeat import InstanceConflict, RolledBack, ShardGone, process_heartbeat
from master.sync.notifier import NewsUnavailable, TooManyWaits, wait_for_news

log = logging.getLogger(__name__)


def _error(status: int, message: str, field: str | None = None, **detail: object) -> JsonResponse:
    return JsonResponse(error_body(message, field, **detail), status=status)


def _unavailable(exc: Exception) -> JsonResponse:
    """A lost connection or a restarting database: the transaction rolled back and the shard retries."""
    log.warning("heartbeat: database unavailable: %s", exc)
    return _error(503, "the master's database is unavailable; retry", None)


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> HttpResponse:
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
        req = HeartbeatRequest.parse(loads(raw_body, check_depth=False))
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
        response = process_heartbeat(token.shard, req)
    except InstanceConflict as exc:
        return _error(409, exc.message, "instance", heard_s_ago=round(exc.heard_s_ago, 1))
    except RolledBack as exc:
        return _error(409, exc.message, "last_seq", seq_seen=exc.seq_seen)
    except ShardGone as exc:
        return _error(401, f"unknown or revoked shard token: {exc}", "Authorization")
    except DatabaseFailure as exc:
        return _unavailable(exc)
    return HttpResponse(dumps(response.to_wire()), content_type="application/json")


DEFAULT_WAIT_S = 30.0
MAX_SINCE_S = 86400.0


def _seconds(request: HttpRequest, name: str, default: float | None, maximum: float) -> float | None:
    raw = request.GET.get(name)
    if raw is None:
        return default
    try:
        value = float(raw[:32])
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= maximum:
        raise ValueError(f"{name} must be a number of seconds from 0 to {maximum:g}, not {raw[:32]!r}")
    return value


def _shard_token(request: HttpRequest) -> Token | JsonResponse:
    raw_token = bearer_token(request.headers.get("Authorization", ""))
    if raw_token is None:
        return _error(401, "missing shard token: send 'Authorization: Bearer <shard token>'", "Authorization")
    try:
        with work_slot():
            token = find_token(raw_token)
            if token is not None:
                touch(token)
    except DatabaseFailure as exc:
        return _unavailable(exc)
    if token is None:
        return _error(401, "unknown or revoked shard token", "Authorization")
    if token.shard is None:
        return _error(403, "a personal token cannot wait for a shard's news; use the shard's token", "Authorization")
    return token


def _client_gone(request: HttpRequest) -> Callable[[], bool] | None:
    """Whether the client of a held wait hung up (a shard restarting, a hostile one): under gunicorn,
    which gives the view its socket, the wait then frees its thread instead of holding it to the end."""
    sock = request.META.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return None

    def gone() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, ValueError):  # nothing to read; a TLS socket cannot peek
            return False
        except OSError:
            return True

    return gone


@require_GET
def heartbeat_wait(request: HttpRequest) -> JsonResponse:
    """Held until the token's shard has news or `timeout` seconds pass (docs/protocol.md, "Waiting for
    news"); `since` says how long ago the shard sent its last heartbeat, so news since then ends it at once.
    Holds no database connection while it waits."""
    try:
        since_s = _seconds(request, "since", None, MAX_SINCE_S)
        timeout_s = _seconds(request, "timeout", DEFAULT_WAIT_S, settings.FLEETSHARD_LONGPOLL_MAX_S)
    except ValueError as exc:
        field = "since" if str(exc).startswith("since") else "timeout"
        return _error(400, f"invalid wait: {exc}", field)
    token = _shard_token(request)
    if isinstance(token, JsonResponse):
        return token
    assert token.shard is not None and timeout_s is not None
    try:
        news = wait_for_news(token.shard.id, since_s, timeout_s, _client_gone(request))
    except (NewsUnavailable, TooManyWaits) as exc:
        return _error(503, f"{exc}; heartbeat at the interval", None)
    return JsonResponse({"news": news})
