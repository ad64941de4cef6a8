"""Regressions are found after uploads (by the detector draining the series they marked), once, and
fixed when the series steps back."""

import pytest

from master.models import AuditRecord, Regression, TestRun
from master.results.detection import drain
from master.results.ingest import store_result_file
from master.results.regressions import set_regression_status
from tests.master.results.factories import hour, stepped, tf_file

pytestmark = pytest.mark.django_db


def upload_series(values, test="t", entry="e", offset=0):
    """Uploads one file per value, then runs the detector as the master's would after them."""
    for i, value in enumerate(values):
        store_result_file(tf_file(test, hour(offset + i), {entry: value}), f"{i}.json", acting_user=None)
    drain()


def test_a_step_up_raises_one_new_regression_at_the_first_slow_run():
    upload_series(stepped(30, 10))
    (reg,) = Regression.objects.all()
    first_slow = TestRun.objects.get(start=hour(30))
    assert (reg.test, reg.entry, reg.label, reg.start, reg.run_id) == ("t", "e", "", hour(30), first_slow.id)
    assert reg.status == "new"
    assert reg.before_s == pytest.approx(1.0, rel=0.02) and reg.after_s == pytest.approx(1.3, rel=0.02)
    assert reg.change_pct == pytest.approx(30, abs=3)


def test_a_flat_series_or_a_small_step_raises_nothing():
    upload_series(stepped(30, 10, after=1.0))
    upload_series(stepped(30, 10, after=1.03), entry="small")
    assert not Regression.objects.exists()


def test_a_step_down_is_not_a_regression():
    upload_series(stepped(30, 10, after=0.7))
    assert not Regression.objects.exists()


@pytest.mark.parametrize("status", ["new", "acknowledged"])
def test_an_open_regression_is_fixed_when_the_series_steps_back(status):
    upload_series(stepped(30, 10))
    reg = Regression.objects.get()
    if status != "new":
        set_regression_status(reg.id, status, acting_user=None)
    upload_series(stepped(30, 10, n_back=10)[40:], offset=40)
    reg.refresh_from_db()
    assert reg.status == "fixed" and reg.fixed_on is not None
    assert Regression.objects.count() == 1


def test_an_invalid_regression_stays_invalid_and_is_not_raised_again():
    upload_series(stepped(30, 10))
    reg = Regression.objects.get()
    set_regression_status(reg.id, "invalid", acting_user=None)
    upload_series(stepped(30, 20)[40:], offset=40)
    assert list(Regression.objects.values_list("status", flat=True)) == ["invalid"]


def brief_slowdown() -> tuple[list[float], list[float]]:
    """Four points 7% slower raise a regression; the points after them, 3% slower, show it was less
    than the 5% minimum all along."""
    return stepped(30, 4, after=1.07), [1.03 * v for v in stepped(0, 12, after=1.0)]


def test_a_new_regression_the_longer_series_no_longer_shows_is_withdrawn():
    first, rest = brief_slowdown()
    upload_series(first)
    assert list(Regression.objects.values_list("start", "status")) == [(hour(30), "new")]
    upload_series(rest, offset=len(first))
    assert not Regression.objects.exists()


@pytest.mark.parametrize("status", ["acknowledged", "invalid", "fixed"])
def test_a_regression_a_person_triaged_is_not_withdrawn(status):
    first, rest = brief_slowdown()
    upload_series(first)
    reg = Regression.objects.get()
    set_regression_status(reg.id, status, acting_user=None)
    upload_series(rest, offset=len(first))
    assert list(Regression.objects.values_list("id", "status")) == [(reg.id, status)]


def test_withdrawing_one_regression_leaves_the_series_other_regressions():
    upload_series(stepped(30, 10, after=1.3), entry="e")
    first, rest = brief_slowdown()
    upload_series([1.3 * v for v in first], offset=40)  # 1.3 then 1.39: a second step on top of the first
    assert list(Regression.objects.order_by("start").values_list("start", flat=True)) == [hour(30), hour(70)]
    upload_series([1.3 * v for v in rest], offset=40 + len(first))
    assert list(Regression.objects.values_list("start", "status")) == [(hour(30), "new")]


def test_a_regression_whose_first_slow_runs_share_one_start_is_kept_as_the_series_grows():
    """Runs of one test may share a start (hosts of one board running it at the same second, or files
    uploaded again edited). The regression starts at the first of them; matched to the last of them,
    it was withdrawn by the next upload and raised again by the one after."""
    for i, value in enumerate(stepped(20, 0)):
        store_result_file(tf_file("t", hour(i), {"e": value}), f"{i}.json", acting_user=None)
    for k in range(8):
        store_result_file(tf_file("t", hour(20), {"e": 1.3 + 0.001 * k}), f"s{k}.json", acting_user=None)
    drain()
    (reg,) = Regression.objects.all()
    assert reg.start == hour(20)
    for i in range(21, 24):
        upload_series([1.3], offset=i)
        assert list(Regression.objects.values_list("id", "start", "status")) == [(reg.id, hour(20), "new")]


def test_series_are_split_by_entry_and_test():
    upload_series(stepped(30, 10), entry="slow")
    upload_series(stepped(30, 10, after=1.0), entry="flat")
    upload_series(stepped(30, 10, after=1.0), test="other", entry="slow")
    assert list(Regression.objects.values_list("test", "entry")) == [("t", "slow")]


def test_status_changes_are_audited(django_user_model):
    upload_series(stepped(30, 10))
    reg = Regression.objects.get()
    boss = django_user_model.objects.create(username="boss", is_staff=True)
    set_regression_status(reg.id, "acknowledged", acting_user=boss)
    entry = AuditRecord.objects.get(action="regression.set_status")
    assert (entry.actor, entry.details["from"], entry.details["to"]) == ("boss", "new", "acknowledged")
    assert [(t.kind, t.object_id) for t in entry.targets.all()] == [("regression", reg.id)]


def test_a_bad_status_or_id_is_refused_naming_it():
    upload_series(stepped(30, 10))
    reg = Regression.objects.get()
    with pytest.raises(Exception, match="invalid regression status 'gone'"):
        set_regression_status(reg.id, "gone", acting_user=None)
    with pytest.raises(Exception, match="unknown regression 999999"):
        set_regression_status(999999, "fixed", acting_user=None)
    reg.refresh_from_db()
    assert reg.status == "new" and not AuditRecord.objects.filter(action="regression.set_status").exists()


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_uploads_and_detectors_racing_on_one_series_raise_its_regression_once():
    """Two files completing the same step, each uploaded then drained at once: both stored, one
    regression, nothing left marked."""
    import threading

    from django.db import connection

    from master.models import DirtySeries

    values = stepped(30, 12)
    upload_series(values[:-2])
    Regression.objects.all().delete()
    barrier = threading.Barrier(2)
    errors = []

    def go(i):
        try:
            barrier.wait()
            store_result_file(tf_file("t", hour(i), {"e": values[i]}), f"{i}.json", acting_user=None)
            drain()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in (40, 41)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and TestRun.objects.count() == 42
    assert Regression.objects.count() == 1
    # One drain's claim can skip the series while the other's _forget holds it, after which that
    # forget keeps it (re-marked): left for the detector's next pass, which finds nothing new.
    drain()
    assert Regression.objects.count() == 1
    assert not DirtySeries.objects.exists()
