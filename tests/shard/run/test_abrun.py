"""The A/B driver (shard/run/abrun.py) against a hostile job's results/: it runs as the shard's user, so
whatever the job leaves there must neither crash it, nor stop the runs, nor reach outside results/."""

import contextlib
import os
import signal
import subprocess
from collections import defaultdict
from pathlib import Path

from common.ab import make_plan, tags_of
from shard.run.abrun import MAX_NAME_BYTES, driver_command, driver_env, run, tag_name, tag_results
from tests.support import wait_until

OWNERS = (os.geteuid(),)
ENTRY = '{"name":"t","startTime":1700000000,"entries":{"entry":[{"name":"e","iters":1,"wallTime":%s}]}}'


def test_names_the_job_blocked_or_made_too_long_are_tagged_another_way_and_nothing_crashes(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.json").write_text(ENTRY % 1.0)
    (results / "ab-1-A--x.json").mkdir()  # the job took the tagged name: rename() cannot replace a directory
    (results / "ab-1-A--x.json" / "keep").write_text("")
    (results / "z.json").write_text(ENTRY % 4.0)
    for blocked in (tag_name(1, "A", "z.json"), tag_name(1, "A", "z.json", long=True)):
        (results / blocked).mkdir()  # both of its names: it stays as it is, and the log says so
        (results / blocked / "keep").write_text("")
    long_names = ["y" * 240 + "1.json", "y" * 240 + "2.json"]  # tagged, past one path component's 255 bytes
    for name in long_names:
        (results / name).write_text(ENTRY % 2.0)
    (results / "a\nb.json").write_text(ENTRY % 3.0)
    os.mkfifo(results / "fifo.json")
    (results / "link.json").symlink_to("/etc/passwd")
    series: dict = defaultdict(list)

    assert tag_results(results, 1, "A", series, OWNERS) == 6
    assert "cannot tag 'z.json' (Is a directory): it is left as the job named it" in capsys.readouterr().out
    names = set(os.listdir(results))
    assert {"z.json", "ab-1-A--a\nb.json", "ab-1-A--fifo.json", "ab-1-A--link.json"} <= names
    assert "x.json" not in names and tag_name(1, "A", "x.json", long=True) in names
    long_tagged = sorted(n for n in names if n.startswith("ab-1-A--yyy"))
    assert len(long_tagged) == 2 and all(len(os.fsencode(n)) <= MAX_NAME_BYTES for n in long_tagged)
    assert [tags_of(n)[:2] for n in long_tagged] == [("A", 1), ("A", 1)]
    assert (results / "ab-1-A--x.json" / "keep").exists()
    assert Path("/etc/passwd").is_file() and not Path("/etc/ab-1-A--link.json").exists()
    assert sorted(series[("t", "e")]) == [1.0, 2.0, 2.0, 3.0]  # neither the FIFO nor the link was read


def test_results_that_is_a_link_or_a_fifo_is_not_touched(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.json").write_text(ENTRY % 1.0)
    (tmp_path / "results").symlink_to(elsewhere)
    assert tag_results(tmp_path / "results", 1, "A", None, OWNERS) == 0
    assert os.listdir(elsewhere) == ["x.json"]
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would wait for a writer forever
    assert tag_results(tmp_path / "fifo", 1, "A", None, OWNERS) == 0


def test_every_run_runs_when_the_job_blocks_a_tagged_name(tmp_path, capfd):
    results = tmp_path / "results"
    command = (
        f"mkdir -p {results}/ab-1-A--r.json; echo '{ENTRY % 1.0}' > {results}/r.json;"
        ' echo "ran $FLEETSHARD_VARIANT $FLEETSHARD_REPEAT"'
    )
    assert run(make_plan(["A", "B"], 2), command, results) == 0
    out = capfd.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("ran ")] == [
        "ran A 1",
        "ran B 1",
        "ran A 2",
        "ran B 2",
    ]
    assert "done: 2 pairs; worst exit status 0" in out
    tagged = sorted(tags_of(n)[:2] for n in os.listdir(results) if tags_of(n) and (results / n).is_file())
    assert tagged == [("A", 1), ("A", 2), ("B", 1), ("B", 2)]


def _driver(tmp_path: Path, command: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEETSHARD_RESULTS_DIR": str(tmp_path),
        **driver_env(make_plan(["a", "b"], 3).to_json(), command),
    }
    return subprocess.Popen(
        ["/bin/sh", "-c", driver_command()],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_a_sigterm_to_the_whole_run_lets_the_current_run_clean_up_and_starts_no_other(tmp_path):
    # The scheduler's abort signals every process of the run; the driver used to SIGKILL its current
    # run at once, cutting short the clean-up a plain job gets in the grace before SIGKILL.
    marks = tmp_path / "marks"
    # The sleep starts before the mark, so the signal finds it; its output is not the driver's pipe, so
    # one that outlives its shell (forked as the signal came) cannot hold the driver's output open.
    command = (
        f"trap 'sleep 0.5; echo cleaned $FLEETSHARD_REPEAT >> {marks}; exit 5' TERM;"
        f" sleep 30 >/dev/null 2>&1 & echo started $FLEETSHARD_REPEAT >> {marks}; wait"
    )
    driver = _driver(tmp_path, command)
    try:
        wait_until(lambda: marks.exists(), timeout=20, what="the first run")
        os.killpg(driver.pid, signal.SIGTERM)
        out, _ = driver.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 143
    assert marks.read_text() == "started 1\ncleaned 1\n"
    assert b"run 1/3 of variant a exited 5" in out and b"stopped by signal 15 before run 1/3 of variant b" in out
    assert b"Traceback" not in out


def test_a_sigterm_to_the_driver_alone_lets_the_current_run_finish_and_starts_no_other(tmp_path):
    marks = tmp_path / "marks"
    driver = _driver(tmp_path, f"echo $FLEETSHARD_VARIANT >> {marks}; sleep 1")
    try:
        wait_until(lambda: marks.exists(), timeout=20, what="the first run")
        os.kill(driver.pid, signal.SIGTERM)
        out, _ = driver.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 143
    assert marks.read_text() == "a\n"
    assert b"run 1/3 of variant a exited 0" in out and b"stopped by signal 15" in out
