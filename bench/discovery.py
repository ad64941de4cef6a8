"""The master's cost of applying a shard's discovered set: 10,000 hosts, then the same set with 1% of the
hosts changed (attributes) and a few gone, timed in `apply_discovered` alone and counted in SQL queries.

Run: `.venv/bin/python bench/discovery.py [HOSTS]` (default 10000). It uses DATABASE_URL if set (a
throwaway database is expected: it migrates and fills it), else a temporary SQLite file.
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.support import setup_django  # noqa: E402

setup_django("master")

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from common.wire import DiscoveredSet  # noqa: E402
from master import services  # noqa: E402
from master.sync.discovery import apply_discovered  # noqa: E402

ROUNDS = 5


def hosts(n: int, round_no: int) -> list[dict[str, object]]:
    """Round 0: the set; later rounds: 1% of it with new attributes, and the last host gone or back."""
    out = []
    for i in range(n - (round_no % 2)):
        serial = f"S{i}" + (f"-r{round_no}" if round_no and i % 100 == round_no else "")
        out.append({"hostname": f"dev-{i:05d}", "labels": ["bench:board"], "attributes": {"serial": serial}})
    return out


def timed(shard: object, generation: int, records: list[dict[str, object]]) -> tuple[float, int]:
    with CaptureQueriesContext(connection) as queries:
        began = time.perf_counter()
        with transaction.atomic():
            ack = apply_discovered(shard, DiscoveredSet(generation, records), timezone.now())  # type: ignore[arg-type]
        took = time.perf_counter() - began
    assert not ack.rejected, ack.rejected[:3]
    return took * 1000, len(queries)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    call_command("migrate", verbosity=0)
    services.create_labels(["bench:board"], acting_user=None)
    shard, _ = services.create_shard(f"bench-{time.time_ns()}", ["bench:board"], acting_user=None)
    first_ms, first_q = timed(shard, 1, hosts(n, 0))
    changed = [timed(shard, g, hosts(n, g - 1)) for g in range(2, 2 + ROUNDS)]
    same_ms, same_q = timed(shard, 1, hosts(n, 0))  # an old generation again: nothing to do
    print(f"database: {connection.vendor}; {n} discovered hosts")
    print(f"first set (all new):          {first_ms:8.1f} ms, {first_q} queries")
    ms = [c[0] for c in changed]
    print(
        f"1% changed (+1 gone or back): median {statistics.median(ms):8.1f} ms, max {max(ms):.1f} ms, "
        f"{sorted({c[1] for c in changed})} queries ({ROUNDS} rounds)"
    )
    print(f"a generation already applied: {same_ms:8.1f} ms, {same_q} queries")


if __name__ == "__main__":
    main()
