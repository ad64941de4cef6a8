"""Retention of run directories: a run whose result files the master has not taken yet outlives the
retention, up to a horizon past which nothing is kept."""

import os
import time
from pathlib import Path

from shard.run.workspace import ARCHIVE, remove_old_results

DAY = 86400


def run_dir(root: Path, group: str, name: str, days_old: float, results: dict[str, str] | None = None) -> Path:
    """A run directory last changed `days_old` days ago, with these files in its `results/`."""
    path = root / group / name
    path.mkdir(parents=True)
    (path / "job.log").write_text("output")
    if results is not None:
        (path / "results").mkdir()
        for file, text in results.items():
            (path / "results" / file).write_text(text)
    age(path, days_old)
    return path


def age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    for p in (path / "job.log", path):
        os.utime(p, (then, then))


def sweep(root: Path) -> int:
    """The retention as the scheduler runs it: 1 day, and results waiting kept up to 3 days."""
    now = time.time()
    return remove_old_results(root, now - DAY, set(), now - 3 * DAY)


def test_a_run_with_result_files_still_to_upload_is_kept_past_the_retention(tmp_path):
    waiting = run_dir(tmp_path, "7", "1-h1", 2, {"r.json": "{}"})
    done = run_dir(tmp_path, "7", "2-h1", 2, {"notes.txt": "not a result file"})
    empty = run_dir(tmp_path, "7", "3-h1", 2, {})
    bare = run_dir(tmp_path, "7", "4-h1", 2)
    assert sweep(tmp_path) == 3
    assert waiting.exists()
    assert not done.exists() and not empty.exists() and not bare.exists()


def test_once_its_files_are_uploaded_the_run_goes_at_the_next_sweep(tmp_path):
    run = run_dir(tmp_path, "7", "1-h1", 2, {"r.json": "{}"})
    assert sweep(tmp_path) == 0
    (run / ARCHIVE).mkdir()
    (run / "results" / "r.json").rename(run / ARCHIVE / "r.json")
    age(run, 2)
    assert sweep(tmp_path) == 1
    assert not run.exists()


def test_past_the_horizon_a_run_goes_with_its_files_unsent(tmp_path):
    # The master refuses this shard's token for good, or the shard left the fleet: nobody takes them.
    run = run_dir(tmp_path, "7", "1-h1", 4, {"r.json": "{}"})
    assert sweep(tmp_path) == 1
    assert not run.exists()


def test_only_a_jobs_own_results_directory_keeps_a_run(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "r.json").write_text("{}")
    root = tmp_path / "root"
    linked = run_dir(root, "7", "1-h1", 2)
    (linked / "results").symlink_to(elsewhere)
    age(linked, 2)
    host_command = run_dir(root, "hosts/h1", "cleanup-20260101T000000", 2, {"r.json": "{}"})
    assert sweep(root) == 2
    assert not linked.exists() and not host_command.exists()
    assert (elsewhere / "r.json").exists()


def test_without_a_horizon_retention_removes_as_before(tmp_path):
    run = run_dir(tmp_path, "7", "1-h1", 2, {"r.json": "{}"})
    assert remove_old_results(tmp_path, time.time() - DAY, set()) == 1
    assert not run.exists()
