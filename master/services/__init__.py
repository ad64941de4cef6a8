"""The master's domain changes (see master.services.shared)."""

from master.services.shared import *  # noqa: F403
