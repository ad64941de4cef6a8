"""Replaying stale host events: one host with N intervals (default 20,000: Repairing and Cleaning,
30 s apart), then one heartbeat's worth (1,000) of events dated inside that history, recorded
by `record_host_changes` in one transaction that is rolled back; prints the seconds it took.

Run: `DATABASE_URL=... .venv/bin/python bench/host_events.py [--intervals N] [--events M]` on a
throwaway database (migrated here); without DATABASE_URL a SQLite file in a temporary directory.
"""

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.support import setup_django  # noqa: E402

setup_django("master")

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from common.models import Host  # noqa: E402
from master import services  # noqa: E402
from master.timeline.models import Interval  # noqa: E402
from master.timeline.recording import HostChange, record_host_changes  # noqa: E402


class Rollback(Exception):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=1_000)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    name = f"he-{time.time_ns()}"
    services.create_labels([f"board:{name}"], acting_user=None)
    shard, _ = services.create_shard(name, [f"board:{name}"], acting_user=None)
    (host,) = services.create_hosts([name], labels=[f"board:{name}"], acting_user=None)
    t0 = timezone.now() - timedelta(minutes=args.intervals // 2 + 10)
    Interval.objects.bulk_create(
        Interval(
            kind="Repairing" if n % 2 == 0 else "Cleaning",
            host_id=host.id,
            shard_id=shard.id,
            start=t0 + timedelta(seconds=30 * n),
            end=t0 + timedelta(seconds=30 * n + 25),
        )
        for n in range(args.intervals)
    )
    statuses = ("Repairing", "Ready", "Cleaning", "Ready")
    changes = [
        HostChange(host.id, statuses[n % 4], t0 + timedelta(seconds=7 * n + 26), shard.id) for n in range(args.events)
    ]
    started = time.perf_counter()
    try:
        with transaction.atomic():
            record_host_changes(changes)
            elapsed = time.perf_counter() - started
            raise Rollback
    except Rollback:
        pass
    Host.objects.filter(id=host.id).delete()
    print(f"{connection.vendor}: {args.events} events against a host with {args.intervals} intervals: {elapsed:.2f} s")


if __name__ == "__main__":
    main()
