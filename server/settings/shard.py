"""The shard's settings: the shared base, plus the heartbeat client, the scheduler and the shard app.

The shard serves only its read-only admin (server/urls/shard.py), so it needs no REST framework.
"""

import os
from pathlib import Path

from server.settings.base import *  # noqa: F403
from server.settings.base import DATA_DIR, DJANGO_APPS, databases, env_days

ROLE = "shard"
DATABASES = databases(ROLE)
ROOT_URLCONF = "server.urls.shard"

INSTALLED_APPS = [*DJANGO_APPS, "common", "shard", "server"]

# The heartbeat client (shard/sync/client.py): which master, as which shard.
FLEETSHARD_MASTER_URL = os.environ.get("FLEETSHARD_MASTER_URL", "http://127.0.0.1:8000")
FLEETSHARD_SHARD_HOSTNAME = os.environ.get("FLEETSHARD_SHARD_HOSTNAME", "")
FLEETSHARD_SHARD_TOKEN = os.environ.get("FLEETSHARD_SHARD_TOKEN", "")
FLEETSHARD_REQUEST_TIMEOUT_S = float(os.environ.get("FLEETSHARD_REQUEST_TIMEOUT_S", "30"))

# The shard's scheduler and executors (shard/run/scheduler.py). Durations in seconds unless named _mins.
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
# The executor class (a dotted path to a shard.run.executor.Executor subclass) that runs jobs.
FLEETSHARD_EXECUTOR = os.environ.get("FLEETSHARD_EXECUTOR", "shard.run.executor.LocalExecutor")
# What a job sees (shard/run/isolation.py): who it runs as when the shard is root, which of the shard's
# environment variables it gets beyond the allowlist (how much of its output is kept: base.py).
FLEETSHARD_JOB_USER = os.environ.get("FLEETSHARD_JOB_USER", "nobody")
FLEETSHARD_JOB_ENV_PASSTHROUGH = os.environ.get("FLEETSHARD_JOB_ENV_PASSTHROUGH", "")
FLEETSHARD_SHARD_TOKEN_FILE = os.environ.get("FLEETSHARD_SHARD_TOKEN_FILE", "")
# Job inputs (docs/blobs.md): the shard-wide cache, least recently used blobs evicted past this many
# bytes; a run's outputs are uploaded up to FLEETSHARD_MAX_OUTPUT_BYTES.
FLEETSHARD_CACHE_DIR = DATA_DIR / "cache"
FLEETSHARD_CACHE_BYTES = int(os.environ.get("FLEETSHARD_CACHE_BYTES", str(20 * 1024**3)))
FLEETSHARD_MAX_INPUT_BYTES = int(os.environ.get("FLEETSHARD_MAX_INPUT_BYTES", str(2 * 1024**3)))
FLEETSHARD_MAX_OUTPUT_BYTES = int(os.environ.get("FLEETSHARD_MAX_OUTPUT_BYTES", str(1024**3)))
FLEETSHARD_RESULTS_RETENTION_DAYS = env_days("FLEETSHARD_RESULTS_RETENTION_DAYS", "30", zero=True)
# A run whose result files still wait for the master is kept this much longer than the retention.
FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS = env_days("FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS", "30", zero=True)
# A result file, job trace or log the master answered but failed on (a 500, a 409) this many times
# (per shard start) is given up: quarantined with the reason, and the shard's other records go on.
FLEETSHARD_UPLOAD_MAX_TRIES = int(os.environ.get("FLEETSHARD_UPLOAD_MAX_TRIES", "10"))
# How a run's processes are tracked (shard/run/tracking.py): auto, cgroup2, freezer, pids or pgroup.
FLEETSHARD_PROCESS_TRACKING = os.environ.get("FLEETSHARD_PROCESS_TRACKING", "auto")
# The cgroup (under each cgroup mount) that holds this shard's runs; shards sharing a machine may share it.
FLEETSHARD_CGROUP_NAME = os.environ.get("FLEETSHARD_CGROUP_NAME", "fleetshard")
# ADDRESS:PORT where `run_shard` serves /metrics (Prometheus) and /healthz, unauthenticated; empty: off.
FLEETSHARD_METRICS_BIND = os.environ.get("FLEETSHARD_METRICS_BIND", "")
