"""When detection runs: an upload marks its series dirty; the detector drains them after, once per
series however many uploads came, and nothing marked is lost to a detector that dies or to an
upload that lands while it reads."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from master.models import DirtySeries, Regression
from master.results import detection
from master.results.detection import LEASE, SETTLE, claim, detect_claimed, drain, drain_once
from master.results.ingest import store_result_file
from tests.master.results.factories import hour, stepped, tf_file

pytestmark = pytest.mark.django_db


def store(i, timings, test="t"):
    return store_result_file(tf_file(test, hour(i), timings), f"{i}.json", acting_user=None)


def marked():
    return sorted(DirtySeries.objects.values_list("test", "entry", "label"))


def test_an_upload_marks_its_series_and_a_drain_raises_the_regression():
    for i, value in enumerate(stepped(30, 10)):
        store(i, {"e": value, "f": 1.0})
    assert not Regression.objects.exists()  # the upload itself detects nothing
    assert marked() == [("t", "e", ""), ("t", "f", "")]
    assert drain() == 2
    (reg,) = Regression.objects.all()
    assert (reg.test, reg.entry, reg.start, reg.status) == ("t", "e", hour(30), "new")
    assert marked() == [] and drain() == 0


def test_many_uploads_to_a_series_cost_one_detection():
    store(0, {"e": 1.0})
    first = DirtySeries.objects.get()
    for i in range(1, 5):
        store(i, {"e": 1.0})
    store(0, {"x": 1.0}, test="u")
    assert DirtySeries.objects.count() == 2
    again = DirtySeries.objects.get(test="t")
    assert (again.id, again.stamp, again.marked_on) == (first.id, first.stamp, first.marked_on)  # only locked
    assert drain_once() == 2


def test_a_series_marked_while_the_detector_reads_it_is_read_again():
    for i, value in enumerate(stepped(30, 9)):
        store(i, {"e": value})
    now = timezone.now()
    claimed = claim(100, now)
    store(39, {"e": 1.3})  # lands between the detector's claim and its delete
    detect_claimed(claimed, now)
    assert marked() == [("t", "e", "")]
    assert DirtySeries.objects.get().claimed_until is None  # the upload freed it for the next drain
    assert drain() == 1 and marked() == []
    assert Regression.objects.count() == 1


def test_a_claim_whose_detector_died_is_taken_over_after_its_lease():
    for i, value in enumerate(stepped(30, 10)):
        store(i, {"e": value})
    now = timezone.now()
    assert len(claim(100, now)) == 1  # ...and the detector that claimed it died here
    assert drain() == 0 and not Regression.objects.exists()
    assert drain_once(now=now + LEASE + timedelta(seconds=1)) == 1
    assert Regression.objects.count() == 1 and marked() == []


def test_a_series_whose_detection_fails_stays_marked_and_the_others_go_on(monkeypatch, caplog):
    for i, value in enumerate(stepped(30, 10)):
        store(i, {"e": value})
        store(i, {"e": value}, test="broken")
    real = detection.detect_after_upload

    def failing_for_broken(test, label, entries, now=None):
        if test == "broken":
            raise RuntimeError("boom")
        real(test, label, entries, now)

    monkeypatch.setattr(detection, "detect_after_upload", failing_for_broken)
    now = timezone.now()
    assert drain_once(now=now) == 2
    assert marked() == [("broken", "e", "")]
    assert list(Regression.objects.values_list("test", flat=True)) == ["t"]
    assert "regression detection failed for test 'broken'" in caplog.text
    monkeypatch.setattr(detection, "detect_after_upload", real)
    assert drain_once(now=now + LEASE + timedelta(seconds=1)) == 1
    assert sorted(Regression.objects.values_list("test", flat=True)) == ["broken", "t"]


def test_the_served_detector_lets_a_series_settle_before_reading_it():
    store(0, {"e": 1.0})
    now = timezone.now()
    assert drain_once(now=now, settle=SETTLE) == 0  # just marked: more uploads may come
    assert drain_once(now=now + SETTLE, settle=SETTLE) == 1


def test_detect_regressions_once_drains_what_is_marked(capsys):
    for i, value in enumerate(stepped(30, 10)):
        store(i, {"e": value})
    call_command("detect_regressions", "--once")
    assert capsys.readouterr().out.strip() == "1 series read"
    assert Regression.objects.count() == 1 and marked() == []


def test_detect_regressions_refuses_a_bad_interval():
    with pytest.raises(Exception, match="--interval must be positive, got 0.0"):
        call_command("detect_regressions", "--interval", "0")
