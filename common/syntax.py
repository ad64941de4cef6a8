"""People's syntax for priorities and meta-hosts, parsed the same way by the REST API (which stores what
they mean) and the command line (which refuses a malformed value as bad usage before asking the master)."""

import re

from common.constants import PRIORITY_NAMES
from common.errors import FleetshardError

INT32_MAX = 2**31 - 1
ASCII_DIGITS = re.compile(r"[0-9]+")
_PRIORITY_RE = re.compile(r"[+-]?[0-9]{1,10}")


def parse_priority(value: str | int) -> int:
    """An integer from -(2^31-1) to 2^31-1 or a priority name. Digits are ASCII only: Python's int()
    takes '²', '٣' and '1_0', which nobody means as a priority."""
    names = ", ".join(f"{k}={v}" for k, v in PRIORITY_NAMES.items())
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise FleetshardError(f"invalid priority {value!r}: use an integer or one of {names}", field="priority")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in PRIORITY_NAMES:
            return PRIORITY_NAMES[text]
        if not _PRIORITY_RE.fullmatch(text):
            raise FleetshardError(f"invalid priority {value!r}: use an integer or one of {names}", field="priority")
        value = int(text)
    if abs(value) > INT32_MAX:
        raise FleetshardError(
            f"invalid priority {value}: it must be between {-INT32_MAX} and {INT32_MAX}", field="priority"
        )
    return value


def parse_meta_hosts(text: str) -> list[tuple[str, int]]:
    """`board:pixel7*3,board:x` -> [("board:pixel7", 3), ("board:x", 1)].

    N is plain ASCII decimal digits (not '+3', ' 3', '1_0' or '٣', all of which int() takes); its
    size is judged by create_job against the per-job bound, so a huge N is an error naming it."""
    result = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, star, count = item.partition("*")
        if not name.strip():
            raise FleetshardError(f"invalid meta-host {item!r}: it needs a label before '*'", field="meta_hosts")
        if star and not ASCII_DIGITS.fullmatch(count):
            raise FleetshardError(
                f"invalid meta-host {item!r}: the count after '*' must be a whole number in ASCII digits, such as "
                f"{name}*2",
                field="meta_hosts",
            )
        # Python refuses to convert over 4300 digits; any count that long is over the bound anyway.
        n = (int(count) if len(count) <= 100 else 10**100) if star else 1
        result.append((name, n))
    return result


# No `--` and no last `-`: a tagged result name `ab-R-VARIANT--NAME` splits at its first `--` (common/ab.py).
VARIANT_NAME = re.compile(r"(?!.*--)[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?<!-)")
MAX_REPEAT = 1000


def parse_variant_name(value: str, field: str = "variant") -> str:
    """An A/B variant's name: it becomes FLEETSHARD_VARIANT and a directory name on the shard."""
    if not VARIANT_NAME.fullmatch(value):
        raise FleetshardError(
            f"{field}: invalid variant name {value[:80]!r}: use 1-64 letters, digits, '.', '_' or '-'"
            " (a letter or digit first, no '--', not '-' last)",
            field=field,
        )
    return value


def parse_repeat_number(value: str, field: str = "repeat") -> int:
    """Which repeat of an A/B run a result is from, 1 to MAX_REPEAT."""
    if not ASCII_DIGITS.fullmatch(value) or not 1 <= int(value[:6]) <= MAX_REPEAT or len(value) > 6:
        raise FleetshardError(f"{field}: invalid repeat {value!r}: use a number from 1 to {MAX_REPEAT}", field=field)
    return int(value)
