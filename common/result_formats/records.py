"""What a result file turns into, whatever its format, and the value rules every parser applies.

A result file comes from a job, so from anyone: every rule here assumes it is hostile (huge, deep,
NaN, NUL, lone surrogates, wrong types) and refuses it with an error naming the file and the field.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from common.wire import MAX_NAME_CHARS, TIME_MAX, TIME_MIN, YEAR_MAX, YEAR_MIN, clean_text, has_unsafe_chars

MAX_ENTRIES = 10_000
MAX_EXTRAS = 100
MAX_EXTRA_CHARS = 1024
MAX_INT = 2**63 - 1
NO_EXTRAS: Mapping[str, float | str] = MappingProxyType({})


class ResultFormatError(Exception):
    """A result file that cannot be stored; the message reads `FILE: FIELD: what is wrong`."""

    def __init__(self, file: str, field: str, message: str) -> None:
        # The path carries the job's keys: cleaned, or the error could not be stored nor rendered.
        file, field, message = clean_text(file), clean_text(field), clean_text(message)
        super().__init__(f"{file}: {field}: {message}" if field else f"{file}: {message}")
        self.file = file
        self.field = field
        self.message = message


class ParsedEntry(NamedTuple):
    """One benchmark of a run. Times are seconds per iteration; None where the file does not say.

    A named tuple, not a frozen dataclass: a file has up to MAX_ENTRIES of them, and a frozen
    dataclass took four times as long to make (1.3 us each, a quarter of a plain entry's parse)."""

    name: str
    wall_time_s: float | None
    cpu_time_s: float | None = None
    iterations: int | None = None
    throughput: float | None = None  # MB/s (10**6 bytes), TensorFlow's unit
    extras: Mapping[str, float | str] = NO_EXTRAS


@dataclass(frozen=True)
class ParsedRun:
    test: str
    start: datetime  # aware, UTC
    info: Mapping[str, Any]
    entries: tuple[ParsedEntry, ...]
    format: str  # "tensorflow" or "google_benchmark"


class Reader:
    """Reads values of one file, each error naming the file and the value's path.

    `plain`: the file's bytes cannot decode to a string with NUL or a lone surrogate (see
    `plain_bytes`), so the per-string search for them is skipped; the verdict is the same."""

    def __init__(self, file: str, *, plain: bool = False) -> None:
        self.file = file
        self.plain = plain

    def fail(self, path: str, message: str) -> ResultFormatError:
        return ResultFormatError(self.file, path, message)

    def obj(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {_kind(value)}")
        return value

    def items(self, value: object, path: str, max_items: int) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, got {_kind(value)}")
        if len(value) > max_items:
            raise self.fail(path, f"at most {max_items} items, got {len(value)}")
        return value

    def name(self, value: object, path: str) -> str:
        """A test or entry name: a key of series, so refused (never silently changed) when unsafe."""
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {_kind(value)}")
        if not value.strip():
            raise self.fail(path, "must not be empty")
        if len(value) > MAX_NAME_CHARS:
            raise self.fail(path, f"at most {MAX_NAME_CHARS} characters, got {len(value)}")
        if not self.plain and has_unsafe_chars(value):
            raise self.fail(path, "contains NUL or a lone surrogate")
        return value

    def number(self, value: object, path: str, *, negative: bool = False, strings: bool = False) -> float:
        """A finite number; `strings` admits proto-JSON's quoted numbers ("1.5"), never "NaN"."""
        if isinstance(value, str) and strings and len(value) <= 64:
            try:
                value = float(value)
            except ValueError:
                raise self.fail(path, f"not a number: {_show(value)}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"not a number: {_show(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise self.fail(path, f"out of range: {_show(value)}") from None
        if not math.isfinite(number):
            raise self.fail(path, f"not a finite number: {_show(value)}")
        if number < 0 and not negative:
            raise self.fail(path, f"must not be negative, got {_show(value)}")
        return number

    def count(self, value: object, path: str, *, strings: bool = False) -> int:
        """A non-negative integer; proto-JSON writes int64 as a string ("100")."""
        if isinstance(value, str) and strings and 0 < len(value) <= 20 and value.isascii() and value.isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected a whole number, got {_show(value)}")
        if not 0 <= value <= MAX_INT:
            raise self.fail(path, f"expected a whole number from 0 to {MAX_INT}, got {_show(value)}")
        return value

    def text(self, value: object, path: str) -> str:
        """A free-text value (an extra, a label): cleaned, not refused, and bounded."""
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {_kind(value)}")
        if len(value) > MAX_EXTRA_CHARS:
            raise self.fail(path, f"at most {MAX_EXTRA_CHARS} characters, got {len(value)}")
        return value if self.plain else clean_text(value)

    def finite(self, value: float | None, path: str, what: str) -> float | None:
        """A value the parser computed (a median): refused when it overflowed, since no database
        stores infinity."""
        if value is not None and not math.isfinite(value):
            raise self.fail(path, f"{what} is not a finite number")
        return value

    def total(self, values: list[int], path: str) -> int:
        """A sum the parser computed (iterations over repetitions), refused past a bigint."""
        total = sum(values)
        if total > MAX_INT:
            raise self.fail(path, f"the sum over {len(values)} repetitions is past {MAX_INT}")
        return total

    def start(self, when: datetime, path: str) -> datetime:
        if not TIME_MIN <= when <= TIME_MAX:
            raise self.fail(path, f"start {when.isoformat()} is not between {YEAR_MIN} and {YEAR_MAX}")
        return when.astimezone(UTC)

    def extras_key(self, key: str, path: str, extras: Mapping[str, object]) -> str:
        if len(extras) >= MAX_EXTRAS:
            raise self.fail(path, f"at most {MAX_EXTRAS} extras per entry")
        return self.name(key, path)


def plain_bytes(data: bytes) -> bool:
    """Whether no string JSON decodes from `data` can hold NUL or a lone surrogate: it has no `\\u`
    escape, no NUL byte (UTF-16 and UTF-32 have them), and no 0xED byte (UTF-8's surrogates, which
    json reads with surrogatepass, start with it; so do U+D000-U+D7FF, which then take the slow way).
    Three byte scans instead of a search per string."""
    return b"\\u" not in data and b"\x00" not in data and b"\xed" not in data


def clean_info(value: Any) -> Any:
    """The run's info as stored (JSON): NUL and lone surrogates replaced in every key and string,
    since PostgreSQL's jsonb refuses them; depth and size are already bounded by the reader."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k): clean_info(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_info(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
