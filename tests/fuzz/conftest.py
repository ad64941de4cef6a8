"""Prints the fuzz suites' counts at the end of a run (see tests/fuzz/tally.py)."""

import pytest

from tests.fuzz import tally


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    line = tally.summary()
    if line:
        for detail in tally.details():
            terminalreporter.write_line(f"fuzz: {detail}")
        terminalreporter.write_line(line)
