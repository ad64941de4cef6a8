"""`make demo` runs non-interactively (--exit-after-summary), shows every kind of ending, and stops cleanly."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shard.run.tracking import proc_stat
from tests.support import ROOT

pytestmark = pytest.mark.e2e


def processes_mentioning(text: str) -> list[str]:
    """Processes whose command line or environment mention `text` (the demo's children all do)."""
    found = []
    needle = text.encode()
    ancestors, pid = set(), os.getpid()
    while pid > 1:
        ancestors.add(str(pid))
        pid = int(proc_stat(pid)[1])
    for pid in set(filter(str.isdigit, os.listdir("/proc"))) - ancestors:
        for part in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError:
                continue
            if needle in data:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{pid}: {cmdline}")
                break
    return found


@pytest.mark.skipif(
    importlib.util.find_spec("cli.main") is None and not os.environ.get("FLEETSHARD_DEMO_CLI"),
    reason="the demo drives the fleetshard command line (cli/main.py), which is not in this checkout yet",
)
def test_demo_runs_to_its_summary_and_stops_everything(tmp_path):
    data_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "scripts/demo.py", "--data-dir", str(data_dir), "--exit-after-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    rows = {
        line.split()[1]: line.split()
        for line in out.splitlines()
        if line.startswith("  ") and line.split()[0].isdigit()
    }
    assert rows["smoke"][2] == "Completed"
    assert rows["camera-test"][2:4] == ["Failed", "test"]
    assert rows["hang-forever"][2:4] == ["Failed", "timeout"]
    assert rows["soak-test"][2] == "Aborted"
    # Both shards ran jobs, each on its own hosts.
    lines = [" ".join(r) for r in rows.values()]
    assert any("pixel7-0" in line and "lab1.demo" in line for line in lines)
    assert any("tab-0" in line and "lab2.demo" in line for line in lines)
    assert "Admin UI:  http://127.0.0.1:" in out
    # The benchmark job filled the chart: the summary points at it, and the master has the step.
    (chart,) = [line.split()[1] for line in out.splitlines() if line.startswith("Benchmark: ")]
    assert chart.startswith("http://127.0.0.1:") and chart.endswith(
        "/admin/benchmarks/chart/?test=frame_render&entry=BM_render_frame"
    )
    assert out.rstrip().endswith("stopped.")
    assert processes_mentioning(str(data_dir)) == []
