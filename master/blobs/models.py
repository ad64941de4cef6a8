"""What the master knows of its blobs (the bytes are in STORAGES["blobs"]) and of the outputs of runs."""

from django.db import models
from django.utils import timezone

from common.models import HostQueueEntry


class Blob(models.Model):
    """A stored blob: its row is written only once its bytes are in storage, checked."""

    digest = models.CharField(max_length=64, primary_key=True)
    size = models.PositiveBigIntegerField()
    created_on = models.DateTimeField(default=timezone.now)
    # Bumped when a job or an output names it: purge keeps a blob this recent even if nothing refers to it.
    last_used = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.digest[:12]} ({self.size} bytes)"


class Artifact(models.Model):
    """A file a run left in $FLEETSHARD_OUTPUT_DIR: stored as a blob, or skipped with the reason."""

    hqe = models.ForeignKey(HostQueueEntry, on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField(default=0)
    digest = models.CharField(max_length=64, blank=True, default="")
    skipped = models.CharField(max_length=512, blank=True, default="", help_text="Why it was not stored.")

    class Meta:
        ordering = ["hqe_id", "path"]
        constraints = [models.UniqueConstraint(fields=["hqe", "path"], name="artifact_hqe_path_uniq")]
        indexes = [models.Index(fields=["digest"], name="artifact_digest_idx")]

    def __str__(self) -> str:
        return f"{self.path} of HQE {self.hqe_id}"
