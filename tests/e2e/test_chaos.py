"""The chaos run (bench/chaos.py) at a small size: about 200 jobs and one fault of each kind (a poisoned
result file and a host deleted while its results are in flight among them), on PostgreSQL.

It is the proof that nothing is lost, run twice or left behind when the master, the shards, their
database connections and the network fail; `make chaos` runs it at full size.
"""

import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support import ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only(reason="the chaos run terminates PostgreSQL connections and copies databases"),
]


def server_url() -> str:
    """The PostgreSQL server the suite runs on; the chaos run makes (and drops) its own databases there."""
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/postgres"


@pytest.mark.timeout(330)
def test_small_chaos_run_loses_nothing_and_runs_nothing_twice(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSHARD_")}
    env["DATABASE_URL"] = server_url()
    env["DJANGO_SETTINGS_MODULE"] = "server.settings"
    proc = subprocess.run(
        [sys.executable, "bench/chaos.py", "--jobs", "200", "--faults", "1", "--seed", "20261123"]
        + ["--data-dir", str(tmp_path / "chaos"), "--settle-s", "120", "--max-minutes", "4.5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=320,
    )
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, last
    assert last == "chaos: 200 jobs, 8 faults, 0 lost, 0 run twice, 0 disagree"
