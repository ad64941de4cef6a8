"""The driver of an A/B job's run (docs/design.md, "A/B runs and comparisons"): the scheduler starts it
in place of the job's command, as the job user and in the run's own cgroup, so an abort, a timeout
or a shutdown ends it and its current run exactly as it ends a plain job, between runs or inside one.

It runs the command 2 x N times on the HQE's one host, alternating the variants (A B A B ...), each
run with FLEETSHARD_VARIANT and FLEETSHARD_REPEAT; marks each run in the log (its standard output
is the log); renames what each run wrote in results/ to `ab-R-VARIANT--NAME` so the uploader tags
it; and exits with the worst run's status. With `auto`, after each pair from the MIN_RUNS-th on, it
reads the pairs' result files and stops once every entry's 95% interval lies wholly above, below or
inside the minimum change (tachometer's auto-sampling), or after `repeat` pairs; the log says why.

It runs as the shard's user (the job user may not reach the shard's Python) and runs each of the
job's runs as the job user; so it touches the job's files only through a descriptor of results/
opened without following links, renaming within it and reading regular files of the job user
(shard.run.executor.open_regular), as the shard's uploader does. It reads no Django settings and no
database.
"""

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from common.ab import ABPlan, tagged_name, tags_of
from common.constants import MAX_RESULT_FILE_BYTES as MAX_READ_BYTES
from common.result_formats import ResultFormatError, parse_result_file
from common.stats import MIN_RUNS, Decision, compare, decision
from shard.run.executor import DRIVER_USER_ENV, UnsafeFile, open_regular

PLAN_ENV = "FLEETSHARD_AB_PLAN"
COMMAND_ENV = "FLEETSHARD_AB_COMMAND"
INPUTS_ENV = "FLEETSHARD_AB_INPUTS"
RESULT_SUFFIX = ".json"
# One path component; the master takes result names of at most 255 characters.
MAX_NAME_BYTES = 255

Series = dict[tuple[str, str], list[float]]


def say(text: str) -> None:
    print(f"=== fleetshard A/B: {text} ===", flush=True)


def exit_status(code: int) -> int:
    """A run killed by signal N counts as the shell reports it, 128 + N."""
    return 128 - code if code < 0 else code


def tag_results(results: Path, repeat: int, variant: str, series: Series | None, owners: tuple[int, ...]) -> int:
    """Renames the run's new result files with their tags, reading their timings into `series`.

    When the tagged name is taken by something rename() cannot replace (the job made a directory of
    that name), the file takes the long form of the name (with a digest); failing that it is left as
    the job named it and the log says so: the job's own doing, which must not end the other runs."""
    try:
        fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0  # none made, or not a directory of its own: the uploader says so
    tagged = 0
    try:
        names = sorted(n for n in os.listdir(fd) if n.endswith(RESULT_SUFFIX) and tags_of(n) is None)
        for name in names:
            new_name = _rename(fd, name, tag_name(repeat, variant, name), tag_name(repeat, variant, name, long=True))
            if new_name is not None:
                tagged += 1
                if series is not None:
                    _read_timings(fd, new_name, series, owners)
        return tagged
    finally:
        os.close(fd)


def _rename(dir_fd: int, name: str, *new_names: str) -> str | None:
    """Renames `name` within the directory to the first of `new_names` that works, else None."""
    problem = ""
    for new_name in new_names:
        try:
            os.rename(name, new_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileNotFoundError:
            return None  # gone, or the job's other processes took it away
        except OSError as exc:
            problem = exc.strerror or str(exc)
            continue
        return new_name
    say(f"cannot tag {name!r} ({problem}): it is left as the job named it")
    return None


def tag_name(repeat: int, variant: str, name: str, *, long: bool = False) -> str:
    """The tagged name; its long form (the name's start, then a digest of the whole, so two names
    stay two) when asked for or past one path component the master takes (255 bytes)."""
    tagged = tagged_name(repeat, variant, name)
    if not long and len(os.fsencode(tagged)) <= MAX_NAME_BYTES:
        return tagged
    prefix = tagged_name(repeat, variant, "")
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    room = MAX_NAME_BYTES - len(prefix) - len(digest) - 1 - len(RESULT_SUFFIX)
    stem = os.fsencode(name)[:room].decode("utf-8", errors="ignore").removesuffix(RESULT_SUFFIX)
    return f"{prefix}{stem}-{digest}{RESULT_SUFFIX}"


def _read_timings(dir_fd: int, name: str, series: Series, owners: tuple[int, ...]) -> None:
    try:
        fd = open_regular(name, os.O_RDONLY, owners, dir_fd=dir_fd)
    except (OSError, UnsafeFile):
        return
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        return
    try:
        parsed = parse_result_file(name, data)
    except ResultFormatError:
        return  # the master judges it when it is uploaded; here it only decides nothing
    for entry in parsed.entries:
        if entry.wall_time_s is not None:
            series[(parsed.test, entry.name)].append(entry.wall_time_s)


def settled(plan: ABPlan, timings: dict[str, Series]) -> tuple[bool, str]:
    """Whether every entry's change is decided, and why (or why not) in one line."""
    base, new = (timings[v] for v in plan.variants)
    keys = sorted(base.keys() | new.keys())
    if not keys:
        return True, "the runs wrote no result files with timings: nothing to decide on"
    states = {key: decision(compare(base.get(key, []), new.get(key, [])), plan.min_change) for key in keys}
    undecided = [key for key, state in states.items() if state is Decision.UNDECIDED]
    if undecided:
        test, entry = undecided[0]
        return False, f"{len(undecided)} of {len(keys)} entries undecided, such as {test} / {entry}"
    counts = {state: sum(1 for s in states.values() if s is state) for state in Decision}
    return True, (
        f"every entry's 95% interval is decided against the minimum change of {plan.min_change:g}%: "
        f"{counts[Decision.ABOVE]} above, {counts[Decision.BELOW]} below, {counts[Decision.INSIDE]} inside"
    )


def run(
    plan: ABPlan,
    command: str,
    results: Path,
    user: tuple[int, int] | None = None,
    input_dirs: dict[str, str] | None = None,
) -> int:
    worst = 0
    timings: dict[str, Series] = {v: defaultdict(list) for v in plan.variants}
    pairs = plan.repeat
    what = f"up to {pairs} pairs, until decided" if plan.auto else f"{pairs} of each"
    say(f"variants {', '.join(plan.variants)} (baseline {plan.variants[0]}), {what}")
    for repeat in range(1, pairs + 1):
        for variant in plan.variants:
            if _stop:
                say(f"stopped by signal {_stop[0]} before run {repeat}/{pairs} of variant {variant}")
                return 128 + _stop[0]
            say(f"run {repeat}/{pairs} of variant {variant}")
            env = dict(os.environ, FLEETSHARD_VARIANT=variant, FLEETSHARD_REPEAT=str(repeat))
            if input_dirs and variant in input_dirs:
                env["FLEETSHARD_INPUT_DIR"] = input_dirs[variant]
            code = exit_status(_run_once(command, env, user))
            owners = (user[0],) if user else (os.geteuid(),)
            tagged = tag_results(results, repeat, variant, timings[variant] if plan.auto else None, owners)
            say(f"run {repeat}/{pairs} of variant {variant} exited {code}; {tagged} result file(s)")
            worst = max(worst, code)
        if plan.auto and repeat >= MIN_RUNS and not _stop:
            done, why = settled(plan, timings)
            if done:
                say(f"stopped after {repeat} pairs: {why}")
                return worst
            if repeat == pairs:
                say(f"stopped after {repeat} pairs, the most allowed: {why}")
    if _stop:
        say(f"stopped by signal {_stop[0]} after the last run")
        return 128 + _stop[0]
    say(f"done: {pairs} pairs; worst exit status {worst}")
    return worst


# The signal that asked the driver to stop. The scheduler signals every process of the run at once, so
# the current run has its own SIGTERM and the grace before SIGKILL to end as a plain job's would; the
# driver waits for it (killing it at once cut the job's own clean-up short), tags what it wrote, and
# starts no other run.
_stop: list[int] = []


def _stop_soon(signum: int, frame: object) -> None:
    _stop.append(signum)


def _run_once(command: str, env: dict[str, str], user: tuple[int, int] | None) -> int:
    with subprocess.Popen(
        ["/bin/sh", "-c", command],
        env=env,
        stdin=subprocess.DEVNULL,
        user=user[0] if user else None,
        group=user[1] if user else None,
        extra_groups=[] if user else None,
    ) as proc:
        if _stop:
            # The stop came while the run was being started: the scheduler's signal may have missed it.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(_stop[0])
        return proc.wait()


def driver_command() -> str:
    """The shell command the scheduler runs in place of an A/B job's own: this module, by the shard's
    own Python, isolated from the job's PYTHON* variables (-I), with this checkout on its path."""
    root = Path(__file__).resolve().parents[2]
    code = f"import sys; sys.path.insert(0, {str(root)!r}); from shard.run.abrun import main; main()"
    return f"exec {shlex.quote(sys.executable)} -I -c {shlex.quote(code)}"


def driver_env(plan: dict[str, object], command: str, input_dirs: dict[str, str] | None = None) -> dict[str, str]:
    """What the driver reads: the plan, the job's command, and each variant's inputs directory."""
    return {PLAN_ENV: json.dumps(plan), COMMAND_ENV: command, INPUTS_ENV: json.dumps(input_dirs or {})}


def main() -> None:
    plan = ABPlan.from_json(json.loads(os.environ.pop(PLAN_ENV)))
    command = os.environ.pop(COMMAND_ENV)
    if plan is None:
        raise SystemExit("no A/B plan")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_soon)
    user = None
    if DRIVER_USER_ENV in os.environ:
        uid, _, gid = os.environ.pop(DRIVER_USER_ENV).partition(":")
        user = (int(uid), int(gid))
    input_dirs = json.loads(os.environ.pop(INPUTS_ENV, "{}"))
    results = Path(os.environ["FLEETSHARD_RESULTS_DIR"]) / "results"
    sys.exit(run(plan, command, results, user, input_dirs))


if __name__ == "__main__":
    main()
