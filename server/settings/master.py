"""The master's settings: the shared base, plus the REST API, its docs, and the master's own apps."""

import math
import os

from server.settings.base import *  # noqa: F403
from server.settings.base import DATA_DIR, DJANGO_APPS, databases, env_days

ROLE = "master"
DATABASES = databases(ROLE)
# A served master keeps each thread's database connection for this many seconds (0: a new one per
# request), checked before reuse so a restarted database costs one reconnect. Opening a PostgreSQL
# connection costs about as much as storing a 100-entry result file.
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("FLEETSHARD_DB_CONN_MAX_AGE", "60"))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
ROOT_URLCONF = "server.urls.master"

INSTALLED_APPS = [
    *DJANGO_APPS,
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "common",
    "master",
    "server",
]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "master.access.authentication.PersonalTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "master.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "fleetshard API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Operation ids stay `hosts_list` and friends even with endpoints outside /api/v1/ (/metrics).
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "master.api.links.add_links",
    ],
    "ENUM_NAME_OVERRIDES": {
        "HostStatusEnum": "common.constants.HostStatus.ALL",
        "JobStatusEnum": "common.constants.JobStatus.ALL",
        "HQEStatusEnum": "common.constants.HQEStatus.ALL",
        "ShardStatusEnum": ["online", "offline"],
        "RegressionStatusEnum": "master.results.models.RegressionStatus",
        "InputKindEnum": "common.blobs.INPUT_KINDS",
        "KindEnum": ["personal", "shard"],
    },
}

# The API's schema and docs pages follow the API's rule (a token or a login) unless this is 1.
FLEETSHARD_PUBLIC_API_DOCS = os.environ.get("FLEETSHARD_PUBLIC_API_DOCS", "") == "1"

# `purge` keeps a job whose results may still come from its shard (master/services/purge.py), at most this
# long after it ended: a shard's upload horizon (its results retention plus upload grace, 30 + 30 days).

FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS = env_days("FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS", "60")

FLEETSHARD_MAX_HQES_PER_JOB = int(os.environ.get("FLEETSHARD_MAX_HQES_PER_JOB", "500"))  # a job's bound

# Blobs (docs/blobs.md): job inputs and run outputs, in STORAGES["blobs"] (any django-storages backend
# may replace the FileSystemStorage), each at most FLEETSHARD_MAX_INPUT_BYTES; those nothing refers to
# are purged after FLEETSHARD_BLOB_RETENTION_DAYS.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "blobs": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(DATA_DIR / "blobs"), "file_permissions_mode": 0o640},
    },
}
FLEETSHARD_MAX_INPUT_BYTES = int(os.environ.get("FLEETSHARD_MAX_INPUT_BYTES", str(2 * 1024**3)))
FLEETSHARD_MAX_OUTPUT_BYTES = int(os.environ.get("FLEETSHARD_MAX_OUTPUT_BYTES", str(1024**3)))
FLEETSHARD_BLOB_RETENTION_DAYS = float(os.environ.get("FLEETSHARD_BLOB_RETENTION_DAYS", "30"))

# What each `serve` worker runs beside requests: the regression detector, unless this master runs
# `manage.py detect_regressions` on its own (FLEETSHARD_DETECT_IN_SERVE=0),
# and the listener that hears of changes for waiting shards (master/sync/notifier.py).
FLEETSHARD_SERVE_BACKGROUND = (
    ["master.sync.notifier.start_listener"]
    + (
        ["master.results.detection.start_detector_thread"]
        if os.environ.get("FLEETSHARD_DETECT_IN_SERVE", "1") != "0"
        else []
    )
    # The notification sender (docs/notifications.md), unless `manage.py send_notifications` runs it.
    + (["master.notify.sender.start_sender_thread"] if os.environ.get("FLEETSHARD_NOTIFY_IN_SERVE", "1") != "0" else [])
    # The timeline's closed days, built once for the export (master/timeline/days.py), unless
    # `manage.py build_trace_days` builds them.
    + (
        ["master.timeline.days.start_builder_thread"]
        if os.environ.get("FLEETSHARD_TRACE_DAYS_IN_SERVE", "1") != "0"
        else []
    )
)

# Notifications (docs/notifications.md): webhooks to loopback and private addresses only with this 1;
# retries wait FLEETSHARD_NOTIFY_BACKOFF_S, doubling up to _BACKOFF_MAX_S, until _GIVE_UP_S after the event.
FLEETSHARD_NOTIFY_ALLOW_PRIVATE = os.environ.get("FLEETSHARD_NOTIFY_ALLOW_PRIVATE", "") == "1"
FLEETSHARD_NOTIFY_BACKOFF_S = float(os.environ.get("FLEETSHARD_NOTIFY_BACKOFF_S", "10"))
FLEETSHARD_NOTIFY_BACKOFF_MAX_S = float(os.environ.get("FLEETSHARD_NOTIFY_BACKOFF_MAX_S", "3600"))
FLEETSHARD_NOTIFY_GIVE_UP_S = float(os.environ.get("FLEETSHARD_NOTIFY_GIVE_UP_S", "86400"))
FLEETSHARD_NOTIFY_TIMEOUT_S = 10.0
FLEETSHARD_NOTIFY_POLL_S = float(os.environ.get("FLEETSHARD_NOTIFY_POLL_S", "0.25"))
FLEETSHARD_NOTIFY_WORKERS = int(os.environ.get("FLEETSHARD_NOTIFY_WORKERS", "8"))

# Long-polls (GET /api/v1/heartbeat/wait): how many one process holds at once (`serve --waits` sets it
# to the threads it gives them), and how long one is held at most.
# Streamed timeline exports (master/timeline/limits.py): at once per user and per serving process, and
# the seconds after which one ends, cut short, so none holds a connection and snapshot for long.
# Refused at start by name when they mean nothing: a cap of 0 made every export a 500 (no slot to wait
# for), and a deadline of inf or nan one with no end.


def _export_count(name: str, default: str) -> int:
    raw = os.environ.get(name, default)
    if not (raw.strip().isascii() and raw.strip().isdigit() and int(raw) >= 1):
        raise RuntimeError(f"{name} must be a whole number of at least 1, not {raw!r}")
    return int(raw)


def _export_deadline(name: str, default: str) -> float:
    raw = os.environ.get(name, default)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise RuntimeError(f"{name} must be a number of seconds above 0, not {raw!r}")
    return seconds


FLEETSHARD_EXPORTS_PER_USER = _export_count("FLEETSHARD_EXPORTS_PER_USER", "2")
FLEETSHARD_EXPORTS_PER_PROCESS = _export_count("FLEETSHARD_EXPORTS_PER_PROCESS", "4")
FLEETSHARD_EXPORT_DEADLINE_S = _export_deadline("FLEETSHARD_EXPORT_DEADLINE_S", "300")
FLEETSHARD_LONGPOLL_MAX_WAITS = int(os.environ.get("FLEETSHARD_LONGPOLL_MAX_WAITS", "1000"))
FLEETSHARD_LONGPOLL_MAX_S = 60.0
# How many tokens each serving process keeps in its token cache (master/access/token_cache.py); 0 turns
# it off. Every master sharing a database must agree on on or off: a master with it off does not send
# the news that empties the others' caches when a token, a user or a shard changes.
_token_cache = os.environ.get("FLEETSHARD_TOKEN_CACHE", "20000")
if not (_token_cache.strip().isascii() and _token_cache.strip().isdigit()):
    raise RuntimeError(f"FLEETSHARD_TOKEN_CACHE must be a whole number (0: no cache), not {_token_cache!r}")
FLEETSHARD_TOKEN_CACHE = int(_token_cache)

# A host event whose `at` is older than this many days is rejected (docs/protocol.md, "Host events").
FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS = env_days("FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS", "7")

# Notification emails go through Django's mail (docs/notifications.md); a stuck server costs 10 s at most.
EMAIL_HOST = os.environ.get("FLEETSHARD_EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("FLEETSHARD_EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("FLEETSHARD_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("FLEETSHARD_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("FLEETSHARD_EMAIL_TLS", "") == "1"
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("FLEETSHARD_EMAIL_FROM", "fleetshard@localhost")
