"""What both roles share, driven by the environment (see docs/design.md, "Running it").

Each role's module (master.py, shard.py) adds its own apps, URLs and knobs on top; `server.settings`
picks one by FLEETSHARD_ROLE.
"""

import math
import os
from pathlib import Path
from typing import Any

import dj_database_url

from common import constants

BASE_DIR = Path(__file__).resolve().parent.parent.parent

DATA_DIR = Path(os.environ.get("FLEETSHARD_DATA_DIR", "./var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEV_SECRET_KEY = "fleetshard-development-only-secret-key-do-not-use-in-production"
SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = os.environ.get("DEBUG", "").lower() in ("1", "true", "yes")


def env_list(name: str, default: str = "", *, required: bool = False) -> list[str]:
    """A comma-separated setting's items, each stripped: `a, b` is `a` and `b`, not `a` and ` b`,
    which would never match. `required`: set but naming nothing is refused by name."""
    raw = os.environ.get(name, default)
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if required and not items:
        raise RuntimeError(f"{name} is set but names nothing (comma-separated); unset it for the default {default}")
    return items


MAX_DAYS = 36500


def env_days(name: str, default: str, *, zero: bool = False) -> float:
    """A span in days, refused at start by name unless above 0 (or 0 too, with `zero`) and at most a
    century: `now - days` must stay a date (1,000,000 days, an operator's "never", made every
    heartbeat carrying a host event a 500, resent for ever, and stopped a shard's uploads), and inf or
    nan is no span."""
    raw = os.environ.get(name, default)
    try:
        days = float(raw)
    except ValueError:
        days = math.nan
    if not (math.isfinite(days) and (days >= 0 if zero else days > 0) and days <= MAX_DAYS):
        low = "0 or more" if zero else "above 0"
        raise RuntimeError(f"{name} must be a number of days {low} and at most {MAX_DAYS}, not {raw!r}")
    return days


def env_number(name: str, default: str, *, low: float, high: float, whole: bool = False) -> float:
    """A number refused at start by name unless between `low` and `high` (a whole one with `whole`):
    a discovery interval of 0 ran its sources in a busy loop, and `float()`'s own error named no
    variable."""
    raw = os.environ.get(name, default)
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        kind = "a whole number" if whole else "a number"
        raise RuntimeError(f"{name} must be {kind} from {low:,.0f} to {high:,.0f}, not {raw!r}")
    return value


# Set but empty would refuse every request with a 400, the probes included.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]", required=True)
# Origins (scheme://host[:port]) whose forms may post here: the public URL an operator reaches the
# admin at, behind a TLS proxy (deploy/README.md). A browser's Origin has no trailing slash.
CSRF_TRUSTED_ORIGINS = [origin.rstrip("/") for origin in env_list("CSRF_TRUSTED_ORIGINS")]


def _flag(name: str, default: bool) -> bool:
    return os.environ.get(name, "1" if default else "0").strip().lower() in ("1", "true", "yes")


# Behind a TLS-terminating proxy (nginx, deploy/): the proxy says the request came over HTTPS in
# X-Forwarded-Proto, cookies are sent over HTTPS only, and browsers are told to keep to HTTPS.
# Off by default: a development or test master is served over plain HTTP on loopback.
TLS_PROXY = _flag("FLEETSHARD_TLS_PROXY", False)
if TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # Probes and scrapes from the machine itself come over plain HTTP, past the proxy.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    _hsts = os.environ.get("FLEETSHARD_HSTS_SECONDS", str(365 * 24 * 3600)).strip()
    if not _hsts.isdigit():
        raise RuntimeError(f"FLEETSHARD_HSTS_SECONDS must be a whole number of seconds (0: no HSTS), not {_hsts!r}")
    SECURE_HSTS_SECONDS = int(_hsts)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _flag("FLEETSHARD_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = _flag("FLEETSHARD_HSTS_PRELOAD", False)

# Preloading HSTS binds the whole domain for good: the domain's owner decides, not this app's check.
SILENCED_SYSTEM_CHECKS = [] if TLS_PROXY and SECURE_HSTS_PRELOAD else ["security.W021"]
# Some indexes cover their columns on PostgreSQL (INCLUDE: the heartbeat's holdings, the timings); SQLite
# keeps a plain index, which is all it can do, so its warning says nothing an operator could act on.
SILENCED_SYSTEM_CHECKS.append("models.W040")


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
    elif default["ENGINE"] == "django.db.backends.postgresql":
        # A client whose machine vanished (a Slurm node losing power) never closes its connection:
        # the server would keep its advisory locks (a shard's heartbeat, a worker's presence) until
        # TCP keepalive gives up, two hours by default. Probes after 10 s idle end it within 30 s;
        # the client probes too, so a vanished server is noticed as soon.
        options = default.setdefault("OPTIONS", {})
        keepalive = "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
        options["options"] = f"{options.get('options', '')} {keepalive}".strip()
        options.setdefault("keepalives", 1)
        options.setdefault("keepalives_idle", 10)
        options.setdefault("keepalives_interval", 5)
        options.setdefault("keepalives_count", 3)
        # libpq waits for a connection for ever by default: a partitioned worker's reconnect would hang.
        options.setdefault("connect_timeout", 10)
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
    "common.admission.AdmissionMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "common.bidi.BidiControlsMiddleware",
]

WSGI_APPLICATION = "server.wsgi.application"

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
# Times to the second on every admin page (common/formats/en/formats.py).
FORMAT_MODULE_PATH = ["common.formats"]
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

# Discovered hosts (docs/discovery.md): the master's bound per shard and how long a Missing one is kept;
# the shard's sources (comma-separated `file:PATH`, `command:PATH`, `adb`), period and labels.
# The wire reads no set longer than 1,000,000 (common/wire.py); an interval under 1 s is a busy loop.
FLEETSHARD_MAX_DISCOVERED_HOSTS = int(
    env_number("FLEETSHARD_MAX_DISCOVERED_HOSTS", "10000", low=1, high=1_000_000, whole=True)
)
FLEETSHARD_DISCOVERED_FORGET_DAYS = env_days("FLEETSHARD_DISCOVERED_FORGET_DAYS", "7")
FLEETSHARD_DISCOVERY = os.environ.get("FLEETSHARD_DISCOVERY", "")
FLEETSHARD_DISCOVERY_INTERVAL_S = env_number("FLEETSHARD_DISCOVERY_INTERVAL_S", "30", low=1, high=86400)
FLEETSHARD_DISCOVERY_LABELS = os.environ.get("FLEETSHARD_DISCOVERY_LABELS", "")

# FLEETSHARD_LOG_FORMAT=json: one JSON object a line for a log shipper (common/logjson.py); else text.
LOG_FORMAT = os.environ.get("FLEETSHARD_LOG_FORMAT", "text").strip().lower()
if LOG_FORMAT not in ("text", "json"):
    raise RuntimeError(f"FLEETSHARD_LOG_FORMAT must be 'text' or 'json', not {LOG_FORMAT!r}")

if LOG_FORMAT == "json":
    import logging

    from common.logjson import log_uncaught

    # Python's warnings and uncaught exceptions become log lines too, so nothing but JSON reaches the log.
    logging.captureWarnings(True)
    log_uncaught()

# How much of a run's output is kept: by the shard in the run's `job.log`, and by the master, which
# stores the log the shard ships (master/logs/) and marks it cut past this many bytes.
FLEETSHARD_MAX_LOG_BYTES = int(os.environ.get("FLEETSHARD_MAX_LOG_BYTES", str(constants.DEFAULT_MAX_LOG_BYTES)))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "common.logjson.JsonFormatter"},
    },
    "filters": {"one_line_warning": {"()": "common.logfilters.OneLineWarning"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json" if LOG_FORMAT == "json" else "plain"}
    },
    "root": {"handlers": ["console"], "level": os.environ.get("FLEETSHARD_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Its "Retrying (Retry(total=...)) after connection broken by ..." lines repeat, at length, what
        # the shard's own one-line warning says once per failure with the cause.
        "urllib3.connectionpool": {"level": "ERROR"},
        "django.security.DisallowedHost": {"filters": ["one_line_warning"]},
    },
}
