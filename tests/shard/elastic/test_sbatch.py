"""The worker manager reads `--slurm-sbatch-option` as sbatch will (issue 23): nothing the manager sets
can be overridden by a clustered short option or swallowed by a value-taking option left bare."""

import pytest
from django.core.management import CommandError, call_command

from shard.elastic.sbatch import options_of, sbatch_option_refusal


@pytest.mark.parametrize(
    ("arg", "why"),
    [
        ("-Qa0-99", "the manager sets"),  # -Q (quiet), then -a 0-99: an array
        ("-vJx", "the manager sets"),
        ("-QJ", "the manager sets"),
        ("--comment", "--comment needs its value in the same option"),  # would take --job-name=... as its value
        ("--comm", "--comment needs its value"),
        ("-p", "-p needs its value in the same option"),
        ("-Qp", "-p needs its value"),
        ("--job-na=x", "the manager sets"),
        ("--ar=1-3", "the manager sets"),
        ("--out=/tmp/x", "the manager sets"),
        ("--o=x", "the manager sets"),  # ambiguous (output, open-mode, overcommit...), and one of them is owned
        ("--mem-per=1G", "ambiguous"),
        ("--frobnicate=1", "sbatch has no option --frobnicate"),
        ("-Z", "sbatch has no option -Z"),
        ("gpu:2", "not an option"),
        ("--", "not an option"),
        ("--quiet=yes", "--quiet takes no value"),
        ("--comment=a\nb", "control characters"),
        # Workers on another cluster or of another user: squeue --me lists none, so more start each tick.
        ("-Mother", "where the manager's squeue and scancel do not look"),
        ("-QMother", "do not look"),
        ("--clusters=other", "do not look"),
        ("--cluster=other", "do not look"),
        ("--uid=1001", "do not look"),
        # No worker submitted, one that never starts, or an sbatch that does not return.
        ("--test-only", "--test-only submits nothing"),
        ("--test", "--test-only submits nothing"),
        ("-h", "--help submits nothing"),
        ("-u", "--usage submits nothing"),
        ("-V", "--version submits nothing"),
        ("-QH", "--hold holds the worker"),
        ("-W", "--wait waits for the worker to end"),
        ("--wait", "--wait waits"),
        ("--dependency=singleton", "one worker of the pool at a time"),
        ("-dafterok:1?singleton", "one worker of the pool at a time"),
    ],
)
def test_refused_with_why(arg, why):
    refusal = sbatch_option_refusal(arg)
    assert refusal is not None and why in refusal, refusal


@pytest.mark.parametrize(
    ("arg", "names"),
    [
        ("--comment=x", ["comment"]),
        ("--qos=high", ["qos"]),
        ("-phigh", ["partition"]),
        ("-Qv", ["quiet", "verbose"]),
        ("-Qpbig", ["quiet", "partition"]),
        ("--exclusive", ["exclusive"]),
        ("--exclusive=user", ["exclusive"]),
        ("--gres=gpu:2", ["gres"]),
        ("--cpus-per-task=4", ["cpus-per-task"]),
        ("-c4", ["cpus-per-task"]),
    ],
)
def test_whole_options_pass_as_sbatch_reads_them(arg, names):
    assert options_of(arg) == names
    assert sbatch_option_refusal(arg) is None


@pytest.mark.parametrize("option", ["-Qa0-99", "--comment"])
def test_the_command_refuses_them(settings, option):
    settings.ROLE = "shard"
    with pytest.raises(CommandError, match="--slurm-sbatch-option"):
        call_command("run_worker_manager", "--backend=slurm", "--max-workers=1", f"--slurm-sbatch-option={option}")
