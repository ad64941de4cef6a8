"""Regressions of the series an upload touched, and the status people give them.

After each upload the detector (master.results.changepoint) reads the newest `WINDOW` points of each
touched (test, entry, label) series, so its cost per upload is bounded however long the history.
A step up becomes a `new` regression, once: a later upload that places the same step a point or two
away refines it while it is still `new`. An open one (`new` or `acknowledged`) whose series steps
back down becomes `fixed`. A `new` one the longer series no longer shows (a few slow points that
were noise, or a step now placed farther away) is withdrawn: deleted, as nobody has triaged it and
the four statuses are docs/design.md's; one a person has triaged is left alone.
"""

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from common.errors import FleetshardError, NotFound
from master.access.audit import ActingUser, record
from master.notify import events as notify_events
from master.results.changepoint import SAME_STEP, Step, detect_steps, fixed_at, worth_notifying
from master.results.models import OPEN_STATUSES, Regression, RegressionStatus, TestEntry

WINDOW = 200


def detect_after_upload(test: str, label: str, entries: Sequence[str], now: datetime | None = None) -> None:
    """Runs the detector on each series (test, entry, label) for `entries`, in two queries for all."""
    if not entries:
        return
    now = now or timezone.now()
    series: dict[str, list[tuple[datetime, float, int]]] = defaultdict(list)
    rows = (
        TestEntry.objects.filter(test=test, label=label, entry__in=entries, wall_time_s__isnull=False)
        .annotate(n=Window(RowNumber(), partition_by=[F("entry")], order_by=[F("start").desc(), F("id").desc()]))
        .filter(n__lte=WINDOW)
        .values_list("entry", "start", "wall_time_s", "run_id")
    )
    for entry, start, wall, run_id in rows:
        if wall is not None:  # excluded by the query; narrows the type
            series[entry].append((start, wall, run_id))
    known: dict[str, list[Regression]] = defaultdict(list)
    for reg in Regression.objects.filter(test=test, label=label, entry__in=list(series)):
        known[reg.entry].append(reg)
    for entry, points in series.items():
        points.sort()
        _check_series(test, entry, label, points, known[entry], now)


def _check_series(
    test: str, entry: str, label: str, points: list[tuple[datetime, float, int]], known: list[Regression], now: datetime
) -> None:
    starts = [p[0] for p in points]
    values = [p[1] for p in points]
    steps = detect_steps(values)
    # Runs may share a start: a regression starts at the first point of its start, and a step at any
    # point of that start is the same step.
    index_of: dict[datetime, int] = {}
    for i, start in enumerate(starts):
        index_of.setdefault(start, i)
    shown: set[int] = set()  # the known regressions this run of the detector still finds
    for step in steps:
        if not step.is_regression:
            continue
        at = starts[step.index]
        near = [r for r in known if r.start == at or abs(index_of.get(r.start, -(10**9)) - step.index) <= SAME_STEP]
        if near:
            reg = near[0]
            shown.add(reg.id)
            if reg.status == RegressionStatus.NEW and reg.start != at:
                clash = any(r.start == at for r in known)
                if not clash:
                    _refine(reg, step, at, points[index_of[at]][2])
            _confirm(reg, values, step, now)
            continue
        try:
            with transaction.atomic():  # a concurrent upload to the series may raise the same step
                created = Regression.objects.create(
                    test=test,
                    entry=entry,
                    label=label,
                    start=at,
                    before_s=step.before,
                    after_s=step.after,
                    change_pct=step.change_pct,
                    run_id=points[index_of[at]][2],
                    detected_on=now,
                )
        except IntegrityError:
            continue
        known.append(created)
        shown.add(created.id)
        _confirm(created, values, step, now)
    withdrawn = []
    for reg in known:
        index = index_of.get(reg.start)
        if reg.status not in OPEN_STATUSES or index is None:
            continue  # one older than the window is judged no more
        as_step = Step(index, reg.before_s, reg.after_s, reg.change_pct, 0.0)
        if fixed_at(values, as_step) is not None:
            # Only while still open: a person's status set meanwhile wins.
            fixed = Regression.objects.filter(id=reg.id, status__in=OPEN_STATUSES).update(
                status=RegressionStatus.FIXED, fixed_on=now
            )
            if fixed and reg.notified_on is not None:
                reg.status, reg.fixed_on = RegressionStatus.FIXED, now
                notify_events.regression_fixed(reg, now)
        elif reg.status == RegressionStatus.NEW and reg.id not in shown:
            withdrawn.append(reg.id)
    if withdrawn:
        Regression.objects.filter(id__in=withdrawn, status=RegressionStatus.NEW).delete()


def _confirm(reg: Regression, values: list[float], step: Step, now: datetime) -> None:
    """Sends `regression.new` once the detector confirms an open regression (changepoint.worth_notifying)."""
    if reg.notified_on is not None or reg.status not in OPEN_STATUSES or not worth_notifying(values, step):
        return
    if Regression.objects.filter(id=reg.id, notified_on__isnull=True).update(notified_on=now):
        reg.notified_on = now
        notify_events.regression_confirmed(reg, now)


def _refine(reg: Regression, step: Step, start: datetime, run_id: int) -> None:
    """Moves a `new` regression to where the longer series places its step."""
    try:
        with transaction.atomic():
            Regression.objects.filter(id=reg.id).update(
                start=start, run_id=run_id, before_s=step.before, after_s=step.after, change_pct=step.change_pct
            )
    except IntegrityError:
        return  # a concurrent upload placed another regression there
    reg.start, reg.run_id, reg.before_s, reg.after_s, reg.change_pct = (
        start,
        run_id,
        step.before,
        step.after,
        step.change_pct,
    )


def parse_status(value: str) -> RegressionStatus:
    if value not in RegressionStatus.values:
        raise FleetshardError(
            f"invalid regression status {value!r}: use one of {', '.join(RegressionStatus.values)}", field="status"
        )
    return RegressionStatus(value)


@transaction.atomic
def set_regression_status(regression_id: int, status: str, *, acting_user: ActingUser) -> Regression:
    """Sets a regression's status (a person's triage: acknowledged, invalid, or fixed by hand), audited."""
    new = parse_status(status)
    reg = Regression.objects.select_for_update().filter(id=regression_id).first()
    if reg is None:
        raise NotFound(f"unknown regression {regression_id}", field="id")
    old = reg.status
    reg.status = new
    reg.fixed_on = (reg.fixed_on or timezone.now()) if new == RegressionStatus.FIXED else None
    reg.save(update_fields=["status", "fixed_on"])
    if new == RegressionStatus.FIXED and old != new and reg.notified_on is not None:
        notify_events.regression_fixed(reg, timezone.now())
    record(
        "regression.set_status",
        acting_user=acting_user,
        targets=[reg],
        details={
            "regression": reg.id,
            "test": reg.test,
            "entry": reg.entry,
            "label": reg.label,
            "from": old,
            "to": new.value,
        },
    )
    return reg
