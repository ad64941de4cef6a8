"""The suite's own hooks (tests/conftest.py)."""

import execnet
import pytest

from tests.conftest import pytest_runtest_logreport


def test_a_reports_captured_surrogates_become_escapes_xdist_can_send():
    """A hostile file name a job wrote is logged with lone surrogates; pytest-xdist's worker could not
    send that report (a DumpError ended the run), so the hook shows them as their escapes."""
    sections = [("Captured log call", "WARNING skipped 'out/\udcff\udcfe.bin'"), ("Captured stdout call", "plain")]
    report = pytest.TestReport("t.py::t", ("t.py", 0, "t"), {}, "passed", None, "call", sections)
    with pytest.raises(execnet.DataFormatError):
        execnet.dumps(report.sections)
    pytest_runtest_logreport(report)
    assert execnet.loads(execnet.dumps(report.sections)) == [
        ("Captured log call", "WARNING skipped 'out/\\udcff\\udcfe.bin'"),
        ("Captured stdout call", "plain"),
    ]
