"""The master's settings: the shared base, plus the REST API, its docs, and the master's own apps."""

import os

from common.settings.base import *  # noqa: F403
from common.settings.base import DJANGO_APPS, SILENCED_SYSTEM_CHECKS, databases

ROLE = "master"
DATABASES = databases(ROLE)
# A served master keeps each thread's database connection for this many seconds (0: a new one per
# request), checked before reuse so a restarted database costs one reconnect. Opening a PostgreSQL
# connection costs about as much as storing a 100-entry result file.
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("FLEETSHARD_DB_CONN_MAX_AGE", "60"))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
ROOT_URLCONF = "master.urls"

INSTALLED_APPS = [
    *DJANGO_APPS,
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "common",
    "master",
]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "master.auth.PersonalTokenAuthentication",
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
    "EXCEPTION_HANDLER": "master.api_errors.exception_handler",
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
    },
}

# The API's schema and docs pages follow the API's rule (a token or a login) unless this is 1.
FLEETSHARD_PUBLIC_API_DOCS = os.environ.get("FLEETSHARD_PUBLIC_API_DOCS", "") == "1"

FLEETSHARD_MAX_HQES_PER_JOB = int(os.environ.get("FLEETSHARD_MAX_HQES_PER_JOB", "500"))  # a job's bound

# What each `serve` worker runs beside requests: the regression detector, unless this master runs
# `manage.py detect_regressions` on its own (FLEETSHARD_DETECT_IN_SERVE=0),
# and the listener that hears of changes for waiting shards (master/notifier.py).
FLEETSHARD_SERVE_BACKGROUND = ["master.notifier.start_listener"] + (
    ["master.results.detection.start_detector_thread"]
    if os.environ.get("FLEETSHARD_DETECT_IN_SERVE", "1") != "0"
    else []
)

# Long-polls (GET /api/v1/heartbeat/wait): how many one process holds at once (`serve --waits` sets it
# to the threads it gives them), and how long one is held at most.
FLEETSHARD_LONGPOLL_MAX_WAITS = int(os.environ.get("FLEETSHARD_LONGPOLL_MAX_WAITS", "1000"))
FLEETSHARD_LONGPOLL_MAX_S = 60.0

# The timings index covers its columns on PostgreSQL (INCLUDE); SQLite keeps a plain index, which is
# all it can do, so its warning says nothing an operator could act on.
SILENCED_SYSTEM_CHECKS = [*SILENCED_SYSTEM_CHECKS, "models.W040"]
