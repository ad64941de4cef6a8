"""Deletes this role's finished history older than --older-than, in batches (each role's purge module)."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.module_loading import import_string

from common.purge import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, parse_age

PURGES = {"master": "master.services.purge.purge", "shard": "shard.purge.purge"}


class Command(BaseCommand):
    help = (
        "Delete finished jobs (with their HQEs and intervals), audit records and, with --results, benchmark "
        "results older than --older-than, a batch per transaction. On a shard: its finished jobs and dead letters."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 90d, 12w, 36h")
        parser.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
        parser.add_argument("--results", action="store_true", help="master: old benchmark results go too")
        parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            age = parse_age(options["older_than"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        batch_size = options["batch_size"]
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise CommandError(f"--batch-size must be between 1 and {MAX_BATCH_SIZE}, not {batch_size}")
        if options["results"] and settings.ROLE != "master":
            raise CommandError("--results is for the master: a shard keeps no benchmark results")
        cutoff = timezone.now() - age
        verbosity = options["verbosity"]

        def progress(kind: str, ids: list[int]) -> None:
            if verbosity >= 2:
                self.stdout.write(f"{kind}: deleted a batch of {len(ids)} (ids {ids[0]}-{ids[-1]})")

        purge = import_string(PURGES[settings.ROLE])
        extra = {"results": options["results"]} if settings.ROLE == "master" else {}
        report = purge(cutoff, dry_run=options["dry_run"], batch_size=batch_size, on_batch=progress, **extra)
        batches = sum(report.batches.values())
        self.stdout.write(
            f"purge on the {settings.ROLE}, older than {cutoff:%Y-%m-%d %H:%M:%S} UTC: {report.line()}"
            + ("" if report.dry_run else f" in {batches} batch{'es' * (batches != 1)}")
        )
