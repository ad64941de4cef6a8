"""What a timeline export or its totals cover (docs/design.md, "Timelines": shards, label, jobs, window),
and the SQL both share: intervals are clipped to the window in the database the same way for both,
so the totals equal the sums of the exported slices."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Expression, F, Func, Q, QuerySet, Value
from django.db.models.fields import DateTimeField, FloatField
from django.db.models.functions import Coalesce, Greatest, Least

from common.errors import FleetshardError, NotFound
from common.models import Job, Shard
from master import services
from master.timeline.models import Interval

MAX_FILTER_VALUES = 1000


@dataclass(frozen=True)
class Scope:
    """Intervals of these shards (hostnames), hosts with this label, these jobs, overlapping
    [since, until); open intervals end at `now`. None or empty: no restriction."""

    now: datetime
    shards: tuple[str, ...] = ()
    label: str | None = None
    jobs: tuple[int, ...] = ()
    since: datetime | None = None
    until: datetime | None = None

    @property
    def end(self) -> datetime:
        """Where the window ends: `until`, but never after now (nothing is known later)."""
        return self.now if self.until is None else min(self.until, self.now)


def scope(
    now: datetime,
    *,
    shards: Sequence[str] = (),
    label: str | None = None,
    jobs: Sequence[int] = (),
    since: datetime | None = None,
    until: datetime | None = None,
) -> Scope:
    """A checked scope: unknown shards, labels or jobs are errors that name them."""
    if len(shards) > MAX_FILTER_VALUES or len(jobs) > MAX_FILTER_VALUES:
        raise FleetshardError(f"at most {MAX_FILTER_VALUES} shards and {MAX_FILTER_VALUES} jobs", field="shard")
    if since is not None and until is not None and until <= since:
        raise FleetshardError(f"until ({until.isoformat()}) must be after since ({since.isoformat()})", field="until")
    if since is not None and since > now:
        # Nothing is recorded after now: such a window would clip its slices to negative lengths.
        raise FleetshardError(
            f"since ({since.isoformat()}) is after the master's clock ({now.isoformat()}): nothing is recorded yet",
            field="since",
        )
    names = tuple(dict.fromkeys(shards))
    found = set(Shard.objects.filter(hostname__in=names).values_list("hostname", flat=True)) if names else set()
    missing = [n for n in names if n not in found]
    if missing:
        raise NotFound(f"unknown shard {missing[0]}", field="shard")
    if label is not None:
        services.get_labels([label])
    ids = tuple(dict.fromkeys(jobs))
    known = set(Job.objects.filter(id__in=ids).values_list("id", flat=True)) if ids else set()
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise NotFound(f"unknown job {unknown[0]}", field="job")
    return Scope(now, names, label, ids, since, until)


def selected(s: Scope) -> QuerySet[Interval]:
    """The intervals in scope, with `clip_start` and `clip_end`: the part inside the window."""
    qs = Interval.objects.all()
    if s.shards:
        qs = qs.filter(shard__hostname__in=s.shards)
    if s.label is not None:
        qs = qs.filter(host__labels__name=s.label)
    if s.jobs:
        qs = qs.filter(job_id__in=s.jobs)
    if s.since is not None:
        qs = qs.filter(Q(end__isnull=True) | Q(end__gt=s.since))
    qs = qs.filter(start__lt=s.end)
    start: Any = F("start") if s.since is None else Greatest(F("start"), Value(s.since, DateTimeField()))
    end = Least(Coalesce(F("end"), Value(s.now, DateTimeField())), Value(s.end, DateTimeField()))
    return qs.annotate(clip_start=start, clip_end=end)


class Seconds(Func):
    """`a - b` in seconds, as a float."""

    output_field = FloatField()

    def __init__(self, a: Expression | F, b: Expression | F) -> None:
        super().__init__(a, b)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM (%(expressions)s))", arg_joiner=" - ")

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        (a, pa), (b, pb) = (compiler.compile(e) for e in self.get_source_expressions())
        return f"(({sqlite_micros(a)} - {sqlite_micros(b)}) / 1000000.0)", [*pa, *pa, *pb, *pb]


def sqlite_micros(sql: str) -> str:
    """SQLite's SQL for a stored time (Django writes "YYYY-MM-DD HH:MM:SS[.ffffff]" in UTC) as integer
    microseconds since the epoch; its parameters are needed twice. julianday() keeps only ~10 us
    around today's date, and SQLite reads a time's text to the millisecond, rounded (14.999980 s is
    15 s): so the whole seconds come from the text without its fraction, and the fraction is added."""
    return (
        f"(CAST(strftime('%%s', substr({sql}, 1, 19)) AS INTEGER) * 1000000 "
        f"+ CAST(ROUND(CAST(substr({sql}, 20) AS REAL) * 1000000) AS INTEGER))"
    )
