"""Health probes for load balancers, systemd and Prometheus' blackbox: no token, nothing secret.

`/healthz` says the process answers (it touches nothing else); `/readyz` says it can do its work:
the database answers and has every migration this code needs. A failing probe names what failed in
a word or two, never a host name, a path or a database error's text.
"""

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from common.schema import pending_migrations

log = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readiness() -> dict[str, str]:
    """What /readyz reports: `database` ok or unreachable, `migrations` ok or N pending."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        pending = pending_migrations()
    except DatabaseError as exc:
        log.warning("readiness: the database cannot be reached: %s", exc)
        connection.close()
        return {"database": "unreachable", "migrations": "unknown"}
    return {"database": "ok", "migrations": f"{len(pending)} pending" if pending else "ok"}


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = readiness()
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "not ready", **checks},
        status=200 if ready else 503,
    )
