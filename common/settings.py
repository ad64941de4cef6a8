"""One settings module for both roles, driven by the environment (see DESIGN.md, "Running it")."""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

ROLE = os.environ.get("FLEETSHARD_ROLE", "master")
if ROLE not in ("master", "shard"):
    raise RuntimeError(f"FLEETSHARD_ROLE must be 'master' or 'shard', not {ROLE!r}")

DATA_DIR = Path(os.environ.get("FLEETSHARD_DATA_DIR", "./var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEV_SECRET_KEY = "fleetshard-development-only-secret-key-do-not-use-in-production"
SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = os.environ.get("DEBUG", "").lower() in ("1", "true", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / f'{ROLE}.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several threads and processes share one file: wait for the lock instead of failing,
    # and take the write lock at BEGIN so two writers never deadlock on an upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "common",
    "master",
    "shard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = f"{ROLE}.urls"
WSGI_APPLICATION = "common.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "common" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
# Serve the admin's and the API docs' assets straight from the installed apps: no collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = False
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The heartbeat's body limit (docs/protocol.md: 413 over 10 MiB).
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

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
    },
}

# Protocol and scheduling knobs.
FLEETSHARD_HEARTBEAT_INTERVAL_S = float(os.environ.get("FLEETSHARD_HEARTBEAT_INTERVAL_S", "10"))
FLEETSHARD_MASTER_URL = os.environ.get("FLEETSHARD_MASTER_URL", "http://127.0.0.1:8000")
FLEETSHARD_SHARD_HOSTNAME = os.environ.get("FLEETSHARD_SHARD_HOSTNAME", "")
FLEETSHARD_SHARD_TOKEN = os.environ.get("FLEETSHARD_SHARD_TOKEN", "")
FLEETSHARD_REQUEST_TIMEOUT_S = float(os.environ.get("FLEETSHARD_REQUEST_TIMEOUT_S", "30"))
FLEETSHARD_MAX_HQES_PER_JOB = int(os.environ.get("FLEETSHARD_MAX_HQES_PER_JOB", "500"))  # a job's bound

# The shard's scheduler and executors (shard/scheduler.py). Durations in seconds unless named _mins.
FLEETSHARD_RESULTS_DIR = Path(os.environ.get("FLEETSHARD_RESULTS_DIR", str(DATA_DIR / "results"))).resolve()
FLEETSHARD_SCHEDULER_TICK_S = float(os.environ.get("FLEETSHARD_SCHEDULER_TICK_S", "1"))
FLEETSHARD_MAX_RUNS = int(os.environ.get("FLEETSHARD_MAX_RUNS", "100"))
FLEETSHARD_ABORT_GRACE_S = float(os.environ.get("FLEETSHARD_ABORT_GRACE_S", "30"))
FLEETSHARD_DRAIN_S = float(os.environ.get("FLEETSHARD_DRAIN_S", "60"))
FLEETSHARD_CLEANUP_COMMAND = os.environ.get("FLEETSHARD_CLEANUP_COMMAND", "")
FLEETSHARD_REPAIR_COMMAND = os.environ.get("FLEETSHARD_REPAIR_COMMAND", "")
FLEETSHARD_COOLDOWN_S = float(os.environ.get("FLEETSHARD_COOLDOWN_S", "0"))
FLEETSHARD_HOST_COMMAND_TIMEOUT_S = float(os.environ.get("FLEETSHARD_HOST_COMMAND_TIMEOUT_S", "1800"))
# The length of a job's "minute" (timeout_mins, max_runtime_mins): 60, except in tests and the demo.
FLEETSHARD_MINUTE_S = float(os.environ.get("FLEETSHARD_MINUTE_S", "60"))
# The executor class (a dotted path to a shard.executor.Executor subclass) that runs jobs.
FLEETSHARD_EXECUTOR = os.environ.get("FLEETSHARD_EXECUTOR", "shard.executor.LocalExecutor")
# What a job sees (shard/isolation.py): who it runs as when the shard is root, which of the shard's
# environment variables it gets beyond the allowlist, and how much of its output is kept.
FLEETSHARD_JOB_USER = os.environ.get("FLEETSHARD_JOB_USER", "nobody")
FLEETSHARD_JOB_ENV_PASSTHROUGH = os.environ.get("FLEETSHARD_JOB_ENV_PASSTHROUGH", "")
FLEETSHARD_SHARD_TOKEN_FILE = os.environ.get("FLEETSHARD_SHARD_TOKEN_FILE", "")
FLEETSHARD_MAX_LOG_BYTES = int(os.environ.get("FLEETSHARD_MAX_LOG_BYTES", str(100 * 1024 * 1024)))
FLEETSHARD_RESULTS_RETENTION_DAYS = float(os.environ.get("FLEETSHARD_RESULTS_RETENTION_DAYS", "30"))
# How a run's processes are tracked (shard/tracking.py): auto, cgroup2, freezer, pids or pgroup.
FLEETSHARD_PROCESS_TRACKING = os.environ.get("FLEETSHARD_PROCESS_TRACKING", "auto")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FLEETSHARD_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
