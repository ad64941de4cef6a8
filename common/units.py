"""How a time per iteration reads for a person: in the unit that shows it best, as the admin's chart
and the command line's tables both show it (JSON and the API keep seconds)."""

import math


def duration(value: float) -> str:
    """`3.2 µs`, `12.5 ms`, `2.5 s`: the largest unit the value reaches, to four significant digits."""
    if not math.isfinite(value):
        return "-" if math.isnan(value) else f"{value} s"
    value = value + 0.0  # -0.0 reads 0 s
    size = abs(value)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if size >= scale or size == 0:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"
