"""The master's copy of each run's log: what the shard pushed (docs/protocol.md, "Logs").

A log is bytes, exactly as the job wrote them (offsets count bytes, so a repeated or resent chunk is
recognised byte for byte); it is decoded to text only for reading (master/logs/store.py). One row per
HQE says how far the shard got and how much is kept; the bytes are rows of chunks (small appends
share a row, up to 16 KiB: master/logs/store.py).
Defined here, registered through master.models.
"""

from django.db import models

from common.models import HostQueueEntry


class RunLog(models.Model):
    hqe = models.OneToOneField(HostQueueEntry, primary_key=True, on_delete=models.CASCADE, related_name="run_log")
    # Bytes of the shard's log accounted for: the next chunk starts here. Past the cap they are
    # counted, not kept, so `size - kept` is what was cut.
    size = models.PositiveBigIntegerField(default=0)
    kept = models.PositiveBigIntegerField(default=0)
    # The shard said the run's output ended (its last chunk came with `final`).
    complete = models.BooleanField(default=False)
    updated_on = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "master"

    def __str__(self) -> str:
        return f"log of HQE {self.hqe_id} ({self.kept} bytes)"

    @property
    def truncated(self) -> bool:
        return self.size > self.kept


class RunLogChunk(models.Model):
    """Bytes [start, end) of a log's kept part; a log's chunks tile it without gaps or overlaps."""

    log = models.ForeignKey(RunLog, on_delete=models.CASCADE, related_name="chunks")
    start = models.PositiveBigIntegerField()
    end = models.PositiveBigIntegerField()
    data = models.BinaryField()

    class Meta:
        app_label = "master"
        ordering = ["log", "start"]
        constraints = [models.UniqueConstraint(fields=["log", "start"], name="runlogchunk_log_start_uniq")]
        indexes = [models.Index(fields=["log", "end"], name="runlogchunk_log_end_idx")]

    def __str__(self) -> str:
        return f"bytes {self.start}-{self.end} of HQE {self.log_id}'s log"
