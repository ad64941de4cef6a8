"""The heartbeat endpoint: authenticate, parse, hand to master.heartbeat, render. Errors change nothing."""

import json
import logging

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from common.tokens import find_token
from common.wire import ProtocolMismatch, WireError, check_protocol, parse_request
from master.heartbeat import process_heartbeat

log = logging.getLogger(__name__)


def _error(status: int, message: str, detail: object = None) -> JsonResponse:
    return JsonResponse({"error": message, "detail": detail}, status=status)


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    try:
        raw_body = request.body
    except RequestDataTooBig:
        return _error(413, "request body is larger than 10 MiB", {"field": "body"})

    scheme, _, raw_token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not raw_token.strip():
        return _error(401, "missing shard token: send 'Authorization: Bearer <shard token>'")
    token = find_token(raw_token.strip())
    if token is None:
        return _error(401, "unknown or revoked shard token")

    try:
        body = json.loads(raw_body)
    except (ValueError, UnicodeDecodeError) as exc:
        return _error(400, f"body is not valid JSON: {exc}", {"field": "body"})
    try:
        check_protocol(body)
        req = parse_request(body)
    except ProtocolMismatch as exc:
        return _error(409, exc.message, {"field": exc.field, "supported": [1]})
    except WireError as exc:
        return _error(400, f"invalid heartbeat: {exc}", {"field": exc.field})

    if token.shard is None:
        return _error(403, "a personal token cannot heartbeat; use the shard's token", {"field": "Authorization"})
    if token.shard.hostname != req.shard:
        log.warning("heartbeat for shard %s with the token of shard %s refused", req.shard, token.shard.hostname)
        return _error(403, f"this token belongs to another shard than {req.shard}", {"field": "shard"})

    return JsonResponse(process_heartbeat(token.shard_id, req))
