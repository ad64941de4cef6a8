"""What `manage.py purge` shares between the roles: the age syntax, and deleting in batches.

Each role's own rules (which rows are finished and old) live in master/services/purge.py and shard/purge.py.
Every batch is its own transaction, so a purge of years of history never holds one huge transaction
(nor its locks); a purge stopped half-way has deleted whole batches, and the next one goes on.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Model, QuerySet

from common import ages

DEFAULT_BATCH_SIZE = 500
# A batch's ids go into one IN (...): within what SQLite takes in one statement.
MAX_BATCH_SIZE = 10_000
# Longer than any history kept, and short enough that now minus it is still a date.
MAX_AGE = timedelta(days=100 * 365)


def parse_age(text: str) -> timedelta:
    """`90d`, `12h`, `2w`, `30m`, `45s`: a positive age; a ValueError naming the rule otherwise."""
    age = ages.parse_age(text)
    if not age:
        raise ValueError(
            f"--older-than must be a positive whole number and a unit (s, m, h, d or w), like 90d, not {text!r}"
        )
    if age > MAX_AGE:
        raise ValueError(f"--older-than must be at most 100 years, not {text!r}")
    return age


@dataclass
class PurgeReport:
    """Rows deleted (or, in a dry run, that would be) by kind, and the batches each kind took."""

    dry_run: bool
    deleted: Counter[str] = field(default_factory=Counter)
    batches: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        parts = [f"{n} {kind}" for kind, n in self.deleted.items()]
        return f"{verb} {', '.join(parts) if parts else 'nothing'}"


# Called after each committed batch with (kind, ids): the command prints progress with it.
BatchHook = Callable[[str, list[int]], None]


def purge_in_batches(
    report: PurgeReport,
    kind: str,
    candidates: Callable[[], QuerySet[Model]],
    delete_batch: Callable[[list[int]], dict[str, int]],
    count: Callable[[], dict[str, int]],
    *,
    batch_size: int,
    on_batch: BatchHook | None = None,
) -> None:
    """Deletes `candidates()` `batch_size` rows at a time through `delete_batch` (one transaction
    each, which re-checks its rows), adding what each deleted to the report; a dry run adds what
    `count` says the same deletion would remove, and changes nothing."""
    if report.dry_run:
        for label, n in count().items():
            report.deleted[label] += n
        return
    last_id = 0
    while True:
        ids = list(candidates().filter(pk__gt=last_id).order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return
        for label, n in delete_batch(ids).items():
            report.deleted[label] += n
        report.batches[kind] += 1
        last_id = ids[-1]
        if on_batch is not None:
            on_batch(kind, ids)
