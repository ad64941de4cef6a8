"""What both roles share, driven by the environment (see DESIGN.md, "Running it").

Each role's module (master.py, shard.py) adds its own apps, URLs and knobs on top; `common.settings`
picks one by FLEETSHARD_ROLE.
"""

import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent.parent

DATA_DIR = Path(os.environ.get("FLEETSHARD_DATA_DIR", "./var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEV_SECRET_KEY = "fleetshard-development-only-secret-key-do-not-use-in-production"
SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = os.environ.get("DEBUG", "").lower() in ("1", "true", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]


def databases(role: str) -> dict[str, dict[str, Any]]:
    """The role's database: DATABASE_URL, else a SQLite file named for the role in the data dir."""
    url = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / f'{role}.sqlite3'}"
    default: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    if default["ENGINE"] == "django.db.backends.sqlite3":
        # Several threads and processes share one file: wait for the lock instead of failing,
        # and take the write lock at BEGIN so two writers never deadlock on an upgrade.
        default["OPTIONS"] = {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        default["TEST"] = {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")}
    return {"default": default}


# Every role's admin, with the apps it stands on; each role adds its own apps after these.
DJANGO_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
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

# Dotted paths of functions each `serve` worker calls once started, each returning (thread, stop
# event): background work of the role (the master's regression detector).
FLEETSHARD_SERVE_BACKGROUND: list[str] = []

# The heartbeat's period: the shard sends at it, the master counts a shard offline after missing a few.
FLEETSHARD_HEARTBEAT_INTERVAL_S = float(os.environ.get("FLEETSHARD_HEARTBEAT_INTERVAL_S", "10"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FLEETSHARD_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Its "Retrying (Retry(total=...)) after connection broken by ..." lines repeat, at length, what
        # the shard's own one-line warning says once per failure with the cause.
        "urllib3.connectionpool": {"level": "ERROR"},
    },
}
