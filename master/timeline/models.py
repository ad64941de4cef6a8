"""The master's intervals: one row per stretch of a host's time that was not idle (idle is the gap).

A run is recorded from the HQE updates the heartbeat applies (its started_on/finished_on); Cleaning,
Repairing and Repair Failed come from host status changes (`recording.record_host_status`). One
host's intervals never partially overlap, so a trace viewer nests them and totals add up. Defined
here, registered through master.models.
"""

from django.db import models
from django.db.models import Q

from common.constants import HostStatus
from common.models import Host, HostQueueEntry, Job, Shard


class IntervalKind(models.TextChoices):
    RUN = "run"
    CLEANING = HostStatus.CLEANING.value
    REPAIRING = HostStatus.REPAIRING.value
    REPAIR_FAILED = HostStatus.REPAIR_FAILED.value


# The host statuses that are intervals of their own; Ready is the gap and Running is a run.
STATUS_KINDS: tuple[str, ...] = (IntervalKind.CLEANING, IntervalKind.REPAIRING, IntervalKind.REPAIR_FAILED)


class Interval(models.Model):
    kind = models.CharField(max_length=16, choices=IntervalKind.choices)
    # No database constraints: a host, job or HQE deleted later keeps its history (ids stay).
    host = models.ForeignKey(Host, on_delete=models.DO_NOTHING, related_name="intervals", db_constraint=False)
    shard = models.ForeignKey(
        Shard, null=True, blank=True, on_delete=models.SET_NULL, related_name="intervals", db_constraint=False
    )
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.DO_NOTHING, related_name="intervals", db_constraint=False
    )
    # Unique: the run of an HQE is recorded once, however often its update is resent.
    hqe = models.OneToOneField(
        HostQueueEntry,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="interval",
        db_constraint=False,
    )
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True, help_text="Null while the interval is open.")

    class Meta:
        app_label = "master"
        ordering = ["start", "id"]
        indexes = [
            models.Index(fields=["shard", "start"], name="interval_shard_start_idx"),
            models.Index(fields=["host", "start"], name="interval_host_start_idx"),
            models.Index(fields=["job"], name="interval_job_idx"),
            models.Index(fields=["start"], name="interval_start_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__isnull=True) | Q(end__gte=models.F("start")), name="interval_ordered"
            ),
            models.CheckConstraint(
                condition=Q(kind="run", hqe__isnull=False) | (~Q(kind="run") & Q(hqe__isnull=True)),
                name="interval_run_has_hqe",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} on host {self.host_id} from {self.start:%Y-%m-%d %H:%M:%S}"


class RunTrace(models.Model):
    """The Chrome trace a run's job wrote (`trace.json` in its results directory), as the shard uploaded
    it and `jobtrace.sanitised` kept it: complete events only, times in microseconds from the trace's
    first event, nesting mended. The export shifts them to the run and nests them in its slice."""

    hqe = models.OneToOneField(
        HostQueueEntry,
        primary_key=True,
        on_delete=models.DO_NOTHING,
        related_name="trace",
        db_constraint=False,
    )
    # [[name, category, ts_us, dur_us], ...], sorted by ts.
    events = models.JSONField()
    dropped = models.PositiveIntegerField(default=0, help_text="Events of the file that were not kept.")
    created_on = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "master"

    def __str__(self) -> str:
        return f"trace of HQE {self.hqe_id} ({len(self.events)} events)"


class TraceDay(models.Model):
    """A UTC day of the timeline whose closed intervals' slices are built once (master.timeline.days):
    the export splices its pieces in instead of formatting and compressing the day again, unless a
    change to the day came after the build (a TraceChange newer than `as_of`)."""

    day = models.IntegerField(primary_key=True, help_text="Days since 1970-01-01 (UTC) of the intervals' start.")
    built = models.BooleanField(default=False)
    format = models.PositiveSmallIntegerField(default=0, help_text="The slices' format it was built in.")
    as_of = models.BigIntegerField(default=0, help_text="The newest TraceChange its pieces include.")
    intervals = models.PositiveIntegerField(default=0)
    max_end = models.DateTimeField(null=True, blank=True, help_text="The latest end of its slices.")
    built_on = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "master"

    def __str__(self) -> str:
        return f"trace day {self.day} ({'built' if self.built else 'unbuilt'})"


class TracePiece(models.Model):
    """Part of a built day: its slices' text (each slice after a comma) as raw deflate, ended by a full
    flush and compressed apart, so it can stand anywhere in another deflate stream."""

    day = models.ForeignKey(TraceDay, on_delete=models.CASCADE, related_name="pieces")
    seq = models.PositiveIntegerField()
    body = models.BinaryField()
    crc = models.BigIntegerField(help_text="CRC-32 of the text, for the gzip trailer.")
    size = models.BigIntegerField(help_text="Bytes of the text (UTF-8).")

    class Meta:
        app_label = "master"
        constraints = [models.UniqueConstraint(fields=["day", "seq"], name="tracepiece_unique_seq")]

    def __str__(self) -> str:
        return f"piece {self.seq} of trace day {self.day_id}"


class TraceChange(models.Model):
    """A change to what a day before today shows, written by database triggers (migration 0014) in the
    changing transaction: appended, never updated, so writers never wait for each other. One a day
    and transaction at most (`xact`, PostgreSQL's transaction id; 0 on SQLite, whose triggers skip a
    day already marked since its build)."""

    day = models.IntegerField()
    xact = models.BigIntegerField(default=0)

    class Meta:
        app_label = "master"
        indexes = [
            models.Index(fields=["day", "id"], name="tracechange_day_idx"),
            models.Index(fields=["day", "xact"], name="tracechange_day_xact_idx"),
        ]

    def __str__(self) -> str:
        return f"change {self.id} to trace day {self.day}"
