"""The test suite's settings: BOTH roles' apps in one process, which no real deployment has.

Tests build a master world and a shard world side by side (a shard client heartbeating to a master
served by the same test process), so every model, admin, URLconf and command of both roles must be
loadable here. It answers as the master by default (ROOT_URLCONF, ROLE); shard tests say
`pytest.mark.urls("server.urls.shard")` or set `settings.ROLE`. Set as DJANGO_SETTINGS_MODULE in
pyproject.toml's pytest section; processes a test starts (tests/e2e) use server.settings and a real role.
"""

import os

# pytest-xdist's workers (`make test-fast`) each keep their own data dir (sockets, blobs, SQLite
# files) and their own cgroup, so one worker's session end never reaps another's runs.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER and not os.environ.get("FLEETSHARD_TEST_WORKER_DIR"):
    os.environ["FLEETSHARD_TEST_WORKER_DIR"] = "1"
    os.environ["FLEETSHARD_DATA_DIR"] = os.path.join(os.environ.get("FLEETSHARD_DATA_DIR", "./var"), WORKER)
    os.environ["FLEETSHARD_CGROUP_NAME"] = f"fleetshard-test-{os.getpid()}-{WORKER}"

from server.settings.base import databases  # noqa: E402
from server.settings.master import *  # noqa: E402, F403
from server.settings.master import INSTALLED_APPS as MASTER_APPS  # noqa: E402
from server.settings.shard import *  # noqa: E402, F403
from server.settings.shard import INSTALLED_APPS as SHARD_APPS  # noqa: E402

ROLE = "master"
DATABASES = databases(ROLE)
ROOT_URLCONF = "server.urls.master"
INSTALLED_APPS = [*MASTER_APPS, *(app for app in SHARD_APPS if app not in MASTER_APPS)]
# Each test session reaps only its own runs: in the environment, so the shards its tests start agree.
FLEETSHARD_CGROUP_NAME = os.environ.setdefault("FLEETSHARD_CGROUP_NAME", f"fleetshard-test-{os.getpid()}")
# The suite's timelines are set on fixed days of November 2026, which must not age out of the window.
FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS = 36500.0
# Off, so that whether a test's queries include the token lookup does not hang on whether an earlier
# test of the session started this process's change listener; the cache's tests turn it on.
FLEETSHARD_TOKEN_CACHE = 0
