"""sbatch's command line as sbatch (getopt_long) reads it, so an operator's `--slurm-sbatch-option`
is checked as the option sbatch will see, not as the text it looks like.

Each operator option must be whole in itself: a short cluster (`-Qa0-99` is `-Q -a 0-99`) is read
letter by letter, and an option that takes a value must carry it (`--comment=x`, `-px`): left bare, it
would take the manager's next argument (its `--job-name`) as its value. An unknown or ambiguous name
is refused: sbatch would read it in a way this model cannot vouch for.
"""

# What names, runs and logs the workers: another value would hide them from the manager. An array
# would make several workers of one job id that squeue lists as one.
MANAGER_OWNED = ("job-name", "wrap", "parsable", "output", "chdir", "array")
MANAGER_SHOWN = "-J, --job-name, --wrap, --parsable, -o, --output, -D, --chdir, -a, --array"

# Where the manager's `squeue --me` and `scancel --me` (the local cluster, its own user) would not see
# the workers, so it would start more than --max-workers: another cluster, another user.
ELSEWHERE = ("clusters", "cluster", "cluster-constraint", "uid")
# What submits no worker (it prints and exits), or one that never starts, or makes sbatch wait for the
# worker's end (the manager's call times out with the worker submitted).
NO_WORKER = {
    "test-only": "submits nothing",
    "help": "submits nothing",
    "usage": "submits nothing",
    "version": "submits nothing",
    "hold": "holds the worker, which never starts",
    "wait": "waits for the worker to end, which the manager cannot",
}

NONE, REQUIRED, OPTIONAL = 0, 1, 2

# Slurm's sbatch(1) options and whether each takes a value (getopt_long's has_arg).
LONG: dict[str, int] = {
    **dict.fromkeys(
        [
            "account",
            "acctg-freq",
            "array",
            "batch",
            "bb",
            "bbf",
            "begin",
            "chdir",
            "cluster",
            "cluster-constraint",
            "clusters",
            "comment",
            "constraint",
            "container",
            "container-id",
            "core-spec",
            "cores-per-socket",
            "cpu-freq",
            "cpus-per-gpu",
            "cpus-per-task",
            "deadline",
            "delay-boot",
            "dependency",
            "distribution",
            "error",
            "exclude",
            "export",
            "export-file",
            "extra",
            "extra-node-info",
            "gid",
            "gpu-bind",
            "gpu-freq",
            "gpus",
            "gpus-per-node",
            "gpus-per-socket",
            "gpus-per-task",
            "gres",
            "gres-flags",
            "hint",
            "input",
            "job-name",
            "kill-on-invalid-dep",
            "licenses",
            "mail-type",
            "mail-user",
            "mcs-label",
            "mem",
            "mem-bind",
            "mem-per-cpu",
            "mem-per-gpu",
            "mincpus",
            "network",
            "nodefile",
            "nodelist",
            "nodes",
            "ntasks",
            "ntasks-per-core",
            "ntasks-per-gpu",
            "ntasks-per-node",
            "ntasks-per-socket",
            "open-mode",
            "output",
            "partition",
            "power",
            "prefer",
            "priority",
            "profile",
            "qos",
            "reservation",
            "signal",
            "sockets-per-node",
            "switches",
            "thread-spec",
            "threads-per-core",
            "time",
            "time-min",
            "tmp",
            "tres-bind",
            "tres-per-task",
            "uid",
            "wait-all-nodes",
            "wckey",
            "wrap",
        ],
        REQUIRED,
    ),
    **dict.fromkeys(
        [
            "contiguous",
            "help",
            "hold",
            "ignore-pbs",
            "no-requeue",
            "overcommit",
            "oversubscribe",
            "parsable",
            "quiet",
            "reboot",
            "requeue",
            "spread-job",
            "test-only",
            "usage",
            "use-min-nodes",
            "verbose",
            "version",
            "wait",
        ],
        NONE,
    ),
    **dict.fromkeys(["exclusive", "get-user-env", "nice", "no-kill", "propagate"], OPTIONAL),
}
# Short letters and the long option each stands for.
SHORT_VALUE = {
    "A": "account", "a": "array", "B": "extra-node-info", "b": "begin", "C": "constraint", "c": "cpus-per-task",
    "D": "chdir", "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus", "i": "input", "J": "job-name",
    "L": "licenses", "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks", "o": "output",
    "p": "partition", "q": "qos", "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
}  # fmt: skip
SHORT_FLAG = {
    "H": "hold", "h": "help", "k": "no-kill", "O": "overcommit", "Q": "quiet", "s": "oversubscribe",
    "u": "usage", "V": "version", "v": "verbose", "W": "wait",
}  # fmt: skip


class SbatchOptionError(ValueError):
    pass


def _long(name: str) -> str:
    if name in LONG:
        return name
    matches = [known for known in LONG if known.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SbatchOptionError(f"sbatch has no option --{name}")
    owned = [m for m in matches if m in MANAGER_OWNED]
    if owned:
        raise _owned()
    raise SbatchOptionError(f"--{name} is ambiguous to sbatch (--{', --'.join(sorted(matches))}): spell it out")


def _owned() -> SbatchOptionError:
    return SbatchOptionError(f"the manager sets {MANAGER_SHOWN} itself (it finds its workers by their job name)")


def options_of(arg: str) -> list[str]:
    """The long names of the sbatch options one argument holds; SbatchOptionError when it is not one or
    more whole options (a bare value, a value-taking option without its value, an unknown name)."""
    if any(not ch.isprintable() for ch in arg):
        raise SbatchOptionError("control characters are not allowed")
    if arg in ("-", "--") or not arg.startswith("-"):
        raise SbatchOptionError("not an option: give each option with its value, e.g. --comment=x")
    if arg.startswith("--"):
        name, eq, _ = arg[2:].partition("=")
        full = _long(name)
        if eq and LONG[full] == NONE:
            raise SbatchOptionError(f"--{full} takes no value")
        if not eq and LONG[full] == REQUIRED:
            raise SbatchOptionError(f"--{full} needs its value in the same option (--{full}=VALUE)")
        return [full]
    found = []
    for i, letter in enumerate(arg[1:], start=1):
        if letter in SHORT_FLAG:
            found.append(SHORT_FLAG[letter])
        elif letter in SHORT_VALUE:
            found.append(SHORT_VALUE[letter])
            if i == len(arg) - 1 and SHORT_VALUE[letter] not in MANAGER_OWNED:
                raise SbatchOptionError(f"-{letter} needs its value in the same option (-{letter}VALUE)")
            break
        else:
            raise SbatchOptionError(f"sbatch has no option -{letter}")
    return found


def sbatch_option_refusal(arg: str) -> str | None:
    """Why the manager cannot pass `arg` to sbatch before its own options, or None when it can."""
    try:
        names = options_of(arg)
    except SbatchOptionError as exc:
        return str(exc)
    if any(name in MANAGER_OWNED for name in names):
        return str(_owned())
    if "dependency" in names and "singleton" in arg.lower():
        # Every worker of a pool has the pool's job name: one runs at a time, the rest pend behind it.
        return "--dependency=singleton would run one worker of the pool at a time (they share a job name)"
    for name in names:
        if name in ELSEWHERE:
            return f"--{name} would put the workers where the manager's squeue and scancel do not look"
        if name in NO_WORKER:
            return f"--{name} {NO_WORKER[name]}: the manager must start workers it can count"
    return None
