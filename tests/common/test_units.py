"""A time per iteration in its unit, for odd values too: they come from the jobs' result files."""

import pytest

from common.units import duration


@pytest.mark.parametrize(
    "value, shown",
    [
        (2.5, "2.5 s"),
        (0.0125, "12.5 ms"),
        (3.2e-6, "3.2 µs"),
        (1e-10, "0.1 ns"),
        (0, "0 s"),
        (-0.0, "0 s"),
        (-0.0125, "-12.5 ms"),
        (1e300, "1e+300 s"),
        (float("inf"), "inf s"),
        (float("nan"), "-"),
    ],
)
def test_a_duration_reads_in_its_unit(value, shown):
    assert duration(value) == shown
