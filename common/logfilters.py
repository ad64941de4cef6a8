"""Log filters named by settings.LOGGING."""

import logging


class OneLineWarning(logging.Filter):
    """A refusal caused by the client (a Host header not in ALLOWED_HOSTS: a scanner, a mistyped DNS name)
    is one WARNING line saying what was refused, not an ERROR with a traceback per request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True
