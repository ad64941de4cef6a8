"""A real single-node Slurm on loopback for the elastic workers' tests:
munged, slurmctld and slurmd as root in a directory of their own, found by clients through SLURM_CONF."""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port, wait_until

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


@dataclass
class Slurm:
    base: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def jobs(self, name: str) -> list[tuple[str, str]]:
        """(job id, state) of the jobs of that name Slurm lists now."""
        out = self.run("squeue", "--noheader", f"--name={name}", "--format=%i %T")
        return [tuple(line.split()) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def unavailable() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"Slurm is not installed here (no {', '.join(missing)}): .ci/run installs it"
    if os.geteuid() != 0:
        return "a single-node Slurm for tests needs root (its daemons run as root)"
    return None


def config(base: Path) -> str:
    lines = {
        "ClusterName": "fstest",
        "SlurmctldHost": "localhost",
        "SlurmctldPort": str(free_port()),
        "SlurmdPort": str(free_port()),
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={base}/munge/munge.socket.2",
        "StateSaveLocation": f"{base}/state",
        "SlurmdSpoolDir": f"{base}/spool",
        "SlurmctldPidFile": f"{base}/run/slurmctld.pid",
        "SlurmdPidFile": f"{base}/run/slurmd.pid",
        "SlurmctldLogFile": f"{base}/log/slurmctld.log",
        "SlurmdLogFile": f"{base}/log/slurmd.log",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "MpiDefault": "none",
        "SwitchType": "switch/none",
        "MailProg": "/bin/true",
        "SchedulerType": "sched/backfill",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "SlurmdParameters": "config_overrides",
        "SchedulerParameters": "batch_sched_delay=0,sched_interval=1",
        "ReturnToService": "2",
        "MinJobAge": "300",
        "KillWait": "2",
        "InactiveLimit": "0",
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "JobCompType": "jobcomp/none",
        "NodeName": "localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=4096 State=UNKNOWN",
        "PartitionName": "debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    why = unavailable()
    if why:
        pytest.skip(why)
    with running_slurm() as cluster:
        yield cluster


@contextmanager
def running_slurm() -> Iterator[Slurm]:
    """Starts munged, slurmctld and slurmd in a fresh directory; stops them and removes it after."""
    base = Path(tempfile.mkdtemp(prefix="fs-slurm-"))
    base.chmod(0o755)
    for sub in ("etc", "state", "spool", "log", "run", "munge"):
        (base / sub).mkdir()
    (base / "munge").chmod(0o711)
    conf = base / "etc" / "slurm.conf"
    conf.write_text(config(base))
    cluster = Slurm(base, conf)
    env = {**os.environ, **cluster.env}
    munge = base / "munge"
    try:
        subprocess.run(["mungekey", "--create", f"--keyfile={munge}/munge.key"], check=True, timeout=30)
        subprocess.run(
            [
                "munged",
                f"--socket={munge}/munge.socket.2",
                f"--key-file={munge}/munge.key",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            check=True,
            timeout=30,
        )
        subprocess.run(["slurmctld", "-f", str(conf), "-c"], check=True, timeout=30, env=env)
        subprocess.run(["slurmd", "-f", str(conf), "-N", "localhost"], check=True, timeout=30, env=env)
        wait_until(
            lambda: (
                subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
                == "idle"
            ),
            timeout=30,
            what="the Slurm node to be idle",
        )
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], env=env, check=False, timeout=30)
        for pid_file in (base / "run" / "slurmd.pid", base / "run" / "slurmctld.pid", munge / "munged.pid"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        time.sleep(0.5)
        shutil.rmtree(base, ignore_errors=True)
