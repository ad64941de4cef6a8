"""An A/B job's plan (docs/design.md, "A/B runs and comparisons"): which variants, how many repeats,
and the names its result files carry. The master checks a plan when a job is made, the wire carries
it to the shard, and the shard's driver (shard/run/abrun.py) runs it, all through this one type.

The plan travels as a JSON object `{"variants": [NAME, NAME], "repeat": N, "auto": bool, "min_change": PCT}`;
`{}` is a plain job. With `auto`, `repeat` is the most pairs that may run.
"""

import re
from dataclasses import dataclass
from typing import Any

from common.constants import AB_DEFAULT_MIN_CHANGE_PCT as DEFAULT_MIN_CHANGE_PCT
from common.constants import AB_MIN_RUNS as MIN_RUNS
from common.errors import FleetshardError
from common.syntax import MAX_REPEAT, parse_variant_name

VARIANTS = 2
# A variant's own input (`--variant NAME=PATH`) is the job's input `variant+NAME`; each of that
# variant's runs sees it as `$FLEETSHARD_INPUT_DIR/variant`.
VARIANT_INPUT_PREFIX = "variant+"
VARIANT_INPUT = "variant"
# `--repeat auto` without a bound: at most this many pairs.
DEFAULT_AUTO_MAX = 50
_REPEAT = re.compile(r"(?:(?P<n>[0-9]{1,6})|auto(?::(?P<max>[0-9]{1,6}))?)")
# A result file of repeat R of variant V is renamed `ab-R-V--NAME` in results/ by the driver; the
# shard's uploader reads the tags back from the name.
# The variant ends at the first `--` (a variant name has none): a job's own name may have any.
_TAGGED = re.compile(r"ab-(?P<repeat>[0-9]{1,4})-(?P<variant>[A-Za-z0-9][A-Za-z0-9._-]{0,63}?)--(?P<name>.+)", re.S)


@dataclass(frozen=True)
class ABPlan:
    variants: tuple[str, ...]
    repeat: int
    auto: bool = False
    min_change: float = DEFAULT_MIN_CHANGE_PCT

    def to_json(self) -> dict[str, Any]:
        return {
            "variants": list(self.variants),
            "repeat": self.repeat,
            "auto": self.auto,
            "min_change": self.min_change,
        }

    @classmethod
    def from_json(cls, data: object, field: str = "ab") -> "ABPlan | None":
        """The plan a job carries, checked again (it crossed the network); None for a plain job."""
        if data in (None, {}):
            return None
        if not isinstance(data, dict) or set(data) - {"variants", "repeat", "auto", "min_change"}:
            raise FleetshardError(f"{field}: expected an object of variants, repeat, auto and min_change", field=field)
        variants = data.get("variants")
        repeat, auto, min_change = data.get("repeat"), data.get("auto", False), data.get("min_change")
        if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
            raise FleetshardError(f"{field}: variants must be a list of names", field=field)
        if not isinstance(repeat, int) or isinstance(repeat, bool) or not isinstance(auto, bool):
            raise FleetshardError(f"{field}: repeat must be an integer and auto a boolean", field=field)
        if min_change is None:
            min_change = DEFAULT_MIN_CHANGE_PCT
        if not isinstance(min_change, int | float) or isinstance(min_change, bool) or abs(min_change) > 1e300:
            raise FleetshardError(f"{field}: min_change must be a percentage from 0 to 1000", field=field)
        return make_plan(variants, repeat, auto=auto, min_change=float(min_change))


def make_plan(
    variants: list[str], repeat: int, *, auto: bool = False, min_change: float = DEFAULT_MIN_CHANGE_PCT
) -> ABPlan:
    if len(variants) != VARIANTS:
        raise FleetshardError(
            f"variant: an A/B job has exactly {VARIANTS} variants (the baseline first), not {len(variants)}",
            field="variants",
        )
    names = tuple(parse_variant_name(v) for v in variants)
    if names[0] == names[1]:
        raise FleetshardError(
            f"variant: the two variants must have different names, not {names[0]!r} twice", field="variants"
        )
    least = MIN_RUNS if auto else 1
    if not least <= repeat <= MAX_REPEAT:
        what = "pairs for --repeat auto" if auto else "repeats"
        shown = str(repeat) if abs(repeat) < 10**9 else "so many"
        raise FleetshardError(f"repeat: {shown} {what}: use {least} to {MAX_REPEAT}", field="repeat")
    if not 0 <= min_change <= 1000:
        raise FleetshardError(f"min_change: {min_change}: use a percentage from 0 to 1000", field="min_change")
    return ABPlan(names, repeat, auto, min_change)


def parse_repeat(text: str) -> tuple[int, bool]:
    """`N`, `auto` or `auto:MAX` as (repeats or most pairs, auto)."""
    found = _REPEAT.fullmatch(text.strip().lower())
    if found is None:
        raise FleetshardError(f"repeat: {text!r}: use a number, auto or auto:MAX", field="repeat")
    if found["n"] is not None:
        return int(found["n"]), False
    return (int(found["max"]) if found["max"] else DEFAULT_AUTO_MAX), True


def tagged_name(repeat: int, variant: str, name: str) -> str:
    return f"ab-{repeat}-{variant}--{name}"


def tags_of(name: str) -> tuple[str, int, str] | None:
    """(variant, repeat, the name the job gave) of a file the driver renamed; None for any other."""
    found = _TAGGED.fullmatch(name)
    if found is None or not 1 <= int(found["repeat"]) <= MAX_REPEAT:
        return None
    return found["variant"], int(found["repeat"]), found["name"]


def variant_input_name(variant: str) -> str:
    return f"{VARIANT_INPUT_PREFIX}{variant}"
