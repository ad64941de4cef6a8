"""The test suite's settings: BOTH roles' apps in one process, which no real deployment has.

Tests build a master world and a shard world side by side (a shard client heartbeating to a master
served by the same test process), so every model, admin, URLconf and command of both roles must be
loadable here. It answers as the master by default (ROOT_URLCONF, ROLE); shard tests say
`pytest.mark.urls("shard.urls")` or set `settings.ROLE`. Set as DJANGO_SETTINGS_MODULE in
pyproject.toml's pytest section; processes a test starts (tests/e2e) use common.settings and a real role.
"""

import os

from common.settings.base import databases
from common.settings.master import *  # noqa: F403
from common.settings.master import INSTALLED_APPS as MASTER_APPS
from common.settings.shard import *  # noqa: F403
from common.settings.shard import INSTALLED_APPS as SHARD_APPS

ROLE = "master"
DATABASES = databases(ROLE)
ROOT_URLCONF = "master.urls"
INSTALLED_APPS = [*MASTER_APPS, *(app for app in SHARD_APPS if app not in MASTER_APPS)]
# Each test session reaps only its own runs: in the environment, so the shards its tests start agree.
FLEETSHARD_CGROUP_NAME = os.environ.setdefault("FLEETSHARD_CGROUP_NAME", f"fleetshard-test-{os.getpid()}")
