"""The age syntax people type for "how long ago" (`--older-than 90d`, `--since 24h`): one rule for
every command and filter that takes one."""

import re
from datetime import timedelta

_AGE_RE = re.compile(r"([0-9]{1,6})([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(text: str) -> timedelta | None:
    """`90d`, `12h`, `2w`, `30m`, `45s` (ASCII digits, at most six) as a timedelta; None when `text`
    is not an age, so each caller names its own option in its error."""
    match = _AGE_RE.fullmatch(text.strip())
    return timedelta(**{_UNITS[match[2]]: int(match[1])}) if match else None
