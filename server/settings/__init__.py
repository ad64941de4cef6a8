"""The settings of the role this process plays: FLEETSHARD_ROLE=master (the default) or shard.

Each role installs only its own apps (server/settings/master.py, shard.py); the tests use test.py,
which installs both.
"""

import os

from common.constants import ROLES

_ROLE = os.environ.get("FLEETSHARD_ROLE", ROLES[0])
if _ROLE == "master":
    from server.settings.master import *  # noqa: F403
elif _ROLE == "shard":
    from server.settings.shard import *  # noqa: F403
else:
    raise RuntimeError(f"FLEETSHARD_ROLE must be 'master' or 'shard', not {_ROLE!r}")
