"""Errors that services raise; views and commands turn them into 400/404/409 and one-line messages."""


class FleetshardError(Exception):
    """Bad input or a refused change; the message names what is wrong and nothing was changed."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(FleetshardError):
    """A name or id that does not exist."""


class Refused(FleetshardError):
    """Valid input that the rules refuse (a label on two shards, a job spanning shards...)."""
