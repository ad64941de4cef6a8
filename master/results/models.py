"""Stored benchmark results (docs/design.md, "Benchmark results"): runs, their entries, the regressions
found in them, and the files refused from shards. Defined here, registered through master.models.

A series is (test, entry, label): `label` is the host's board label at run time (its first
`board:*` label; "" for uploads from outside), so timings of different boards are never mixed.
Entries repeat `test`, `label` and `start` of their run so that the timings of one series are read
from one index, on PostgreSQL without touching the table.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from common.models import Host, HostQueueEntry, Job, Shard

NAME_CHARS = 255


class TestRun(models.Model):
    """One result file as stored: the same file (test, start, SHA-256 of its bytes) is stored once per
    HQE, and once among people's uploads; the same bytes from two HQEs are two runs (each its own
    host's point). A run whose HQE was purged (hqe null, shard kept) is under neither rule."""

    __test__ = False  # not a pytest test class, whatever its name

    test = models.CharField(max_length=NAME_CHARS)
    start = models.DateTimeField()
    info = models.JSONField(default=dict, blank=True)
    format = models.CharField(max_length=32)
    digest = models.CharField(max_length=64, help_text="SHA-256 of the file's bytes.")
    label = models.CharField(max_length=NAME_CHARS, blank=True, default="", help_text="The host's board label.")
    labels = models.JSONField(default=list, blank=True, help_text="All the host's labels at run time.")
    entry_count = models.PositiveIntegerField(default=0)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="test_runs")
    hqe = models.ForeignKey(HostQueueEntry, null=True, blank=True, on_delete=models.SET_NULL, related_name="test_runs")
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="test_runs")
    shard = models.ForeignKey(Shard, null=True, blank=True, on_delete=models.SET_NULL, related_name="test_runs")
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="test_runs"
    )
    created_on = models.DateTimeField(default=timezone.now)
    revision = models.CharField(
        max_length=NAME_CHARS,
        blank=True,
        default="",
        help_text="What it measured: the job's `revision` keyval, else TestResults' commitId.hash.",
    )
    variant = models.CharField(max_length=NAME_CHARS, blank=True, default="", help_text="An A/B run's variant.")
    repeat = models.PositiveIntegerField(null=True, blank=True, help_text="An A/B run's repeat, from 1.")

    class Meta:
        app_label = "master"
        ordering = ["-start", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["test", "start", "digest", "hqe"],
                condition=models.Q(hqe__isnull=False),
                name="testrun_unique_file_per_hqe",
            ),
            models.UniqueConstraint(
                fields=["test", "start", "digest"],
                condition=models.Q(hqe__isnull=True, shard__isnull=True),
                name="testrun_unique_uploaded_file",
            ),
        ]
        indexes = [
            models.Index(fields=["test", "start"], name="testrun_test_start_idx"),
            models.Index(fields=["revision"], name="testrun_revision_idx", condition=~models.Q(revision="")),
        ]

    def __str__(self) -> str:
        return f"{self.test} {self.start:%Y-%m-%d %H:%M:%S}"


class TestEntry(models.Model):
    """One benchmark of a run; times are seconds per iteration."""

    __test__ = False

    # No per-row foreign key in the database: PostgreSQL checks one per entry written (at commit, a
    # lookup and a lock of the run each), a third of an upload's database time. Migration 0013's
    # triggers check the same rule once per statement instead, and delete a deleted run's entries
    # (docs/design.md, "Benchmark results").
    run = models.ForeignKey(TestRun, on_delete=models.CASCADE, related_name="entries", db_constraint=False)
    test = models.CharField(max_length=NAME_CHARS)
    entry = models.CharField(max_length=NAME_CHARS)
    label = models.CharField(max_length=NAME_CHARS, blank=True, default="")
    start = models.DateTimeField()
    wall_time_s = models.FloatField(null=True, blank=True)
    cpu_time_s = models.FloatField(null=True, blank=True)
    iterations = models.BigIntegerField(null=True, blank=True)
    throughput = models.FloatField(null=True, blank=True)
    extras = models.JSONField(default=dict, blank=True)

    class Meta:
        app_label = "master"
        ordering = ["-start", "-id"]
        verbose_name_plural = "test entries"
        indexes = [
            # Covering on PostgreSQL (Django leaves `include` out elsewhere): recent timings of one
            # entry, and the series the detector reads, come from the index alone.
            models.Index(
                fields=["test", "entry", "start"],
                name="testentry_series_idx",
                include=["label", "wall_time_s", "cpu_time_s", "iterations", "run"],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.test} / {self.entry}"


class RegressionStatus(models.TextChoices):
    NEW = "new"
    ACKNOWLEDGED = "acknowledged"
    INVALID = "invalid"
    FIXED = "fixed"


OPEN_STATUSES = (RegressionStatus.NEW, RegressionStatus.ACKNOWLEDGED)

# What people are shown of a regression, in the API and the admin alike.
REGRESSION_FIELDS = (
    "test",
    "entry",
    "label",
    "start",
    "before_s",
    "after_s",
    "change_pct",
    "status",
    "detected_on",
    "fixed_on",
    "run",
)


class Regression(models.Model):
    """A step up of one series' timings that stayed up; `start` is the first slow run's start."""

    test = models.CharField(max_length=NAME_CHARS)
    entry = models.CharField(max_length=NAME_CHARS)
    label = models.CharField(max_length=NAME_CHARS, blank=True, default="")
    start = models.DateTimeField()
    before_s = models.FloatField()
    after_s = models.FloatField()
    change_pct = models.FloatField()
    status = models.CharField(max_length=16, choices=RegressionStatus.choices, default=RegressionStatus.NEW)
    detected_on = models.DateTimeField(default=timezone.now)
    fixed_on = models.DateTimeField(null=True, blank=True)
    run = models.ForeignKey(TestRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="regressions")
    # When the detector confirmed it (docs/notifications.md): only then is `regression.new` sent.
    notified_on = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "master"
        ordering = ["-detected_on", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["test", "entry", "label", "start"], name="regression_unique_step")
        ]
        indexes = [models.Index(fields=["status", "test"], name="regression_status_test_idx")]

    def __str__(self) -> str:
        return f"{self.test} / {self.entry} [{self.label or '-'}] +{self.change_pct:.1f}% ({self.status})"


class RejectedResult(models.Model):
    """A result file a shard sent for an HQE that could not be stored, and why (shown in the job's stat)."""

    hqe = models.ForeignKey(HostQueueEntry, on_delete=models.CASCADE, related_name="rejected_results")
    name = models.CharField(max_length=NAME_CHARS)
    digest = models.CharField(max_length=64)
    reason = models.TextField()
    created_on = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "master"
        ordering = ["-created_on", "-id"]
        constraints = [models.UniqueConstraint(fields=["hqe", "name", "digest"], name="rejectedresult_unique_file")]

    def __str__(self) -> str:
        return f"{self.name} (HQE {self.hqe_id})"


class DirtySeries(models.Model):
    """A series (test, entry, label) that an upload touched and the detector has not read since.

    Written in the upload's transaction, so a stored run is never left unwatched, even when the
    master dies before the detector runs; several uploads to one series before it runs are one row,
    so one detection (`marked_on` is the first's time). An upload while a detector reads the series
    changes `stamp` and frees the claim: the detector deletes the row only if its stamp is the one
    it claimed. `claimed_until` keeps two detectors off the same series, and lets another take it
    over when the one that claimed it died."""

    test = models.CharField(max_length=NAME_CHARS)
    entry = models.CharField(max_length=NAME_CHARS)
    label = models.CharField(max_length=NAME_CHARS, blank=True, default="")
    stamp = models.BigIntegerField()
    marked_on = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "master"
        verbose_name_plural = "dirty series"
        constraints = [models.UniqueConstraint(fields=["test", "entry", "label"], name="dirtyseries_unique_series")]

    def __str__(self) -> str:
        return f"{self.test} / {self.entry} [{self.label or '-'}]"
