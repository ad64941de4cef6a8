"""Runs' cgroups go under the shard's own cgroup when it is delegated to it (issue 23: they sat at the
hierarchy's top, so the units' `Delegate=yes` did nothing), else where they went before; the start
log says which."""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shard.run.tracking import CGROUP_V2, FREEZER, PIDS, detect, own_cgroup, remove_cgroup
from tests.support import ROOT


def test_own_cgroup_is_read_per_hierarchy(tmp_path):
    f = tmp_path / "cgroup"
    f.write_text("12:pids:/system.slice/shard.service\n6:freezer,devices:/lab\n0::/system.slice/shard.service\n")
    assert own_cgroup(CGROUP_V2, f) == "/system.slice/shard.service"
    assert own_cgroup(FREEZER, f) == "/lab"
    assert own_cgroup(PIDS, f) == "/system.slice/shard.service"
    assert own_cgroup("memory", f) is None
    assert own_cgroup(CGROUP_V2, tmp_path / "missing") is None


PROBE = """
import json, os, sys
from pathlib import Path
unit = Path(sys.argv[1])
(unit / "cgroup.procs").write_text(str(os.getpid()))
from shard.run.tracking import detect
tracker = detect(sys.argv[2], sys.argv[3])
print(json.dumps([tracker.kind, str(tracker.root), tracker.own, tracker.describe()]))
"""


@pytest.mark.parametrize("mechanism", [CGROUP_V2, FREEZER, PIDS])
def test_runs_go_under_a_delegated_own_cgroup_and_the_log_says_so(mechanism):
    here = detect(mechanism, f"ht-probe-{uuid.uuid4().hex[:8]}")
    if here.kind != mechanism or here.root is None:
        pytest.skip(f"{mechanism} cgroups are not writable on this machine")
    remove_cgroup(here.root)
    top = f"fleetshard-unit-test-{uuid.uuid4().hex[:8]}"
    # A unit's cgroup, as systemd makes one with Delegate=yes: this process may make cgroups in it.
    unit = here.root.parent / f"unit-{uuid.uuid4().hex[:8]}.service"
    unit.mkdir()
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(unit), mechanism, top],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        kind, root, own, said = json.loads(out.splitlines()[-1])
        assert (kind, Path(root), own) == (mechanism, unit / top, True)
        assert (
            said
            == f"each run in its own cgroup ({mechanism}) under {unit / top} (the shard's own cgroup, delegated to it)"
        )
        assert not (here.root.parent / top).exists()  # nothing made at the top
    finally:
        for path in (unit / top, unit):
            if path.exists():
                remove_cgroup(path)


def test_at_the_top_it_stays_where_it_was_and_says_why():
    """A shard in the hierarchy's root cgroup (as in this test container) keeps today's place."""
    for mechanism in (CGROUP_V2, FREEZER, PIDS):
        if own_cgroup(mechanism) != "/":
            continue
        tracker = detect(mechanism, f"ht-top-{uuid.uuid4().hex[:8]}")
        if tracker.root is None or tracker.kind != mechanism:
            continue
        try:
            assert tracker.own is False and "the shard's own cgroup is not delegated" in tracker.describe()
        finally:
            remove_cgroup(tracker.root)
        return
    pytest.skip("no writable cgroup hierarchy with this process at its top")
