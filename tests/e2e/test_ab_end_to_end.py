"""End to end: an A/B job on a real shard alternates its two variants on one host, tags each run's
results, and `results compare` finds the entry the treatment made 15% slower and no change on the
other; `--repeat auto` stops as soon as every entry is decided and the log says why."""

import uuid
from pathlib import Path

import pytest

from tests.e2e.test_results_end_to_end import cli, cli_text
from tests.shard.fleet import master_hqes, new_shard, sql
from tests.support import wait_until

pytestmark = pytest.mark.e2e

# Each run writes one TestResults file: slow_path takes 15% longer under `treatment`, fast_path the
# same under both; the repeat's digit is a little deterministic noise.
COMMAND = r"""
case "$FLEETSHARD_VARIANT" in control) slow=1.00; v=0;; treatment) slow=1.15; v=1;; *) exit 3;; esac
n=$FLEETSHARD_REPEAT
mkdir -p "$FLEETSHARD_RESULTS_DIR/results"
slow_entry='{"name":"slow_path","iters":1,"wallTime":%s%d}'
fast_entry='{"name":"fast_path","iters":1,"wallTime":1.00%d}'
printf '{"name":"%s","startTime":%d,"entries":{"entry":['"$slow_entry,$fast_entry"']}}' "$TEST" \
  $((1700000000 + n * 10 + v)) $slow $((n % 10)) $(( (n * 7) % 10 )) > "$FLEETSHARD_RESULTS_DIR/results/run.json"
echo "ran $FLEETSHARD_VARIANT $n"
"""


def _token(master) -> str:
    return master.shell(
        "from master import services\n"
        "_, result = services.create_personal_token('ab-e2e', admin=True, acting_user=None)"
    )


_RUN_OF = "SELECT r.results_dir FROM shard_run r JOIN common_hostqueueentry q ON q.id = r.hqe_id WHERE q.job_id={}"


def _run_log(shard, job: int) -> str:
    """The run's log so far: empty until the run has its directory and has begun writing."""
    ((run_dir,),) = sql(shard.url, _RUN_OF.format(job))
    log = Path(run_dir) / "job.log" if run_dir else None
    return log.read_text() if log is not None and log.exists() else ""


def test_an_ab_job_alternates_variants_and_compare_finds_the_slower_entry(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    token = _token(master_server)
    test = f"ab_{uuid.uuid4().hex[:8]}"
    command = f"TEST={test}\n{COMMAND}"
    created = cli(
        master_server, token, "job", "create", "ab", "-c", command, "-m", shard.label,
        "--variant", "control", "--variant", "treatment", "--repeat", "6", "--revision", "r42",
    )  # fmt: skip
    job = created["id"]
    assert created["ab"] == {"variants": ["control", "treatment"], "repeat": 6, "auto": False, "min_change": 2.0}
    shard.process.start()
    try:
        wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Completed", timeout=120, what="the A/B job")

        def compared() -> list:
            try:
                rows = cli(
                    master_server, token, "results", "compare", "--base", f"{job}:control", "--new", f"{job}:treatment"
                )
            except AssertionError:  # `has no results`: the uploads, in name order, have not reached treatment yet
                return []
            return rows if rows and rows[0]["new_runs"] == 6 and rows[0]["base_runs"] == 6 else []

        rows = wait_until(compared, timeout=60, what="all twelve runs' results on the master")
        runs = cli(master_server, token, "results", "runs", test, "--limit", "0")
    finally:
        assert shard.process.stop() == 0
    assert [(r["entry"], r["verdict"]) for r in rows] == [("slow_path", "slower"), ("fast_path", "no change")]
    assert 13 < rows[0]["change_pct"] < 17
    assert sorted((r["variant"], r["repeat"]) for r in runs) == sorted(
        (v, n) for v in ("control", "treatment") for n in range(1, 7)
    )
    assert {r["revision"] for r in runs} == {"r42"}
    log = _run_log(shard, job)
    order = [line.split()[1] for line in log.splitlines() if line.startswith("ran ")]
    assert order == ["control", "treatment"] * 6
    assert log.count("=== fleetshard A/B: run ") == 24  # a start and an end mark for each of the 12 runs
    assert "=== fleetshard A/B: done: 6 pairs; worst exit status 0 ===" in log
    table = cli_text(
        master_server, token, "results", "compare", "--base", f"{job}:control", "--new", f"{job}:treatment"
    )
    assert "slower" in table.splitlines()[1]


def test_repeat_auto_stops_once_every_entry_is_decided_and_a_failed_run_fails_the_hqe(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    token = _token(master_server)
    test = f"ab_{uuid.uuid4().hex[:8]}"
    # Unlike the job above, fast_path is far from the minimum change too: each variant's runs differ.
    auto = f"TEST={test}\n{COMMAND}".replace("1.00%d}", "%d.00}").replace("$(( (n * 7) % 10 ))", "$((v * 3 + 2))")
    (auto_job,) = [
        cli(master_server, token, "job", "create", "auto", "-c", auto, "-m", shard.label,
            "--variant", "control", "--variant", "treatment", "--repeat", "auto:30")["id"]
    ]  # fmt: skip
    failing = 'test "$FLEETSHARD_VARIANT" = control || exit 7'
    (failing_job,) = [
        cli(master_server, token, "job", "create", "failing", "-c", failing, "-m", shard.label,
            "--variant", "control", "--variant", "treatment", "--repeat", "2")["id"]
    ]  # fmt: skip
    shard.process.start()
    try:
        wait_until(
            lambda: [row[1] for row in master_hqes(master_server, [auto_job, failing_job])] == ["Completed", "Failed"],
            timeout=120,
            what="both A/B jobs ended",
        )
        auto_log, failing_log = _run_log(shard, auto_job), _run_log(shard, failing_job)
    finally:
        assert shard.process.stop() == 0
    assert "stopped after 4 pairs: every entry's 95% interval is decided" in auto_log
    assert "1 above, 0 below, 1 inside" in auto_log or "2 above, 0 below, 0 inside" in auto_log
    assert "run 5/30" not in auto_log
    assert "=== fleetshard A/B: run 2/2 of variant treatment exited 7; 0 result file(s) ===" in failing_log
    assert "worst exit status 7" in failing_log
    (hqe,) = master_hqes(master_server, [failing_job])
    assert hqe[3] == 7
    assert hqe[1] == "Failed"


def test_an_ab_job_is_aborted_inside_a_run_and_another_times_out_like_plain_jobs(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=2)
    token = _token(master_server)
    sleepy = 'echo "start $FLEETSHARD_VARIANT $FLEETSHARD_REPEAT"; sleep 2; echo "end $FLEETSHARD_VARIANT"'
    ab = ("--variant", "control", "--variant", "treatment", "--repeat", "20")
    aborted = cli(master_server, token, "job", "create", "aborted", "-c", sleepy, "-m", shard.label, *ab)["id"]
    timed = cli(
        master_server, token, "job", "create", "timed", "-c", sleepy, "-m", shard.label, *ab, "--max-runtime-mins", "5"
    )["id"]  # fmt: skip
    shard.process.start()
    try:
        wait_until(
            lambda: (
                "start treatment 1" in _run_log(shard, aborted) if sql(shard.url, _RUN_OF.format(aborted)) else False
            ),
            timeout=60,
            what="the aborted job's second run",
        )
        cli(master_server, token, "job", "abort", str(aborted))
        ended = lambda: [r[1] for r in master_hqes(master_server, [aborted, timed])] == ["Aborted", "Failed"]  # noqa: E731
        wait_until(ended, timeout=90, what="one A/B job aborted and the other timed out")
        logs = _run_log(shard, aborted), _run_log(shard, timed)
    finally:
        assert shard.process.stop() == 0
    assert master_hqes(master_server, [timed])[0][2] == "timeout"
    for log in logs:
        # Killed inside a run: that run never ended and no later one started.
        assert "=== fleetshard A/B: done" not in log
        last_start = [line for line in log.splitlines() if line.startswith("start ")][-1]
        assert log.rstrip().splitlines()[-1] == last_start or "end " not in log.split(last_start)[1]
        assert "start control 20" not in log


def test_each_variant_reads_its_own_build_at_input_dir_variant(master_server, tmp_path):
    shard = new_shard(master_server, tmp_path, hosts=1)
    token = _token(master_server)
    builds = tmp_path / "builds"
    builds.mkdir()
    (builds / "old").write_text("old build\n")
    (builds / "new").mkdir()
    (builds / "new" / "bin").write_text("new build\n")
    (builds / "model").write_text("shared model\n")
    command = (
        'v="$FLEETSHARD_INPUT_DIR/variant"; if [ -d "$v" ]; then b=$(cat "$v/bin"); else b=$(cat "$v"); fi; '
        'echo "ran $FLEETSHARD_VARIANT with $b and $(cat "$FLEETSHARD_INPUT_DIR/model")"; '
        'ls "$FLEETSHARD_INPUT_DIR" | tr "\\n" " "; echo; '
        'echo x > "$FLEETSHARD_INPUT_DIR/variant" 2>/dev/null && exit 9; true'
    )
    created = cli(
        master_server, token, "job", "create", "builds", "-c", command, "-m", shard.label, "--repeat", "2",
        "--variant", f"control={builds / 'old'}", "--variant", f"treatment={builds / 'new'}",
        "--input", f"{builds / 'model'}:model",
    )  # fmt: skip
    job = created["id"]
    assert sorted(i["name"] for i in created["inputs"]) == ["model", "variant+control", "variant+treatment"]
    shard.process.start()
    try:
        wait_until(lambda: master_hqes(master_server, [job])[0][1] == "Completed", timeout=120, what="the A/B job")
        log = _run_log(shard, job)
    finally:
        assert shard.process.stop() == 0
    ran = [line for line in log.splitlines() if line.startswith("ran ")]
    assert (
        ran
        == [
            "ran control with old build and shared model",
            "ran treatment with new build and shared model",
        ]
        * 2
    )
    # Each variant sees its own build as `variant`, the shared inputs, and not the other variant's.
    assert [line.split() for line in log.splitlines() if line.startswith("model")] == [["model", "variant"]] * 4
