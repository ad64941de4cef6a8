"""The README's walkthrough, run as written: a newcomer copying it command by command sees what it shows.

The block after the `<!-- walkthrough` comment runs with bash in a fresh directory that looks like a
clone (manage.py and .venv linked in, its own var/), with a real master and a real shard on loopback.
Each command's output (stdout and stderr together, as a terminal shows them) must match the `#   ` lines
after it, where `#   ...` stands for any lines and times and tokens match any time and token.
"""

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.support import ROOT, free_port, wait_until

README = ROOT / "README.md"
OUTPUT = "#   "
ANY_LINES = "..."
TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
TOKEN = re.compile(r"fs_(?:\.\.\.|[A-Za-z0-9_-]{8,})")


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


def walkthrough() -> list[Step]:
    text = README.read_text()
    marker = text.index("<!-- walkthrough")
    block = text[text.index("```sh\n", marker) + len("```sh\n") :]
    block = block[: block.index("\n```")]
    steps: list[Step] = []
    pending = ""
    for line in block.splitlines():
        if pending:
            pending += "\n" + line
            if not line.endswith("\\"):
                steps.append(Step(pending))
                pending = ""
        elif line.startswith(OUTPUT) or line == OUTPUT.rstrip():
            steps[-1].expected.append(line[len(OUTPUT) :])
        elif not line.strip() or line.startswith("#"):
            continue
        elif line.endswith("\\"):
            pending = line
        else:
            steps.append(Step(line))
    return steps


def normalised(line: str) -> str:
    return TOKEN.sub("fs_...", TIME.sub("2000-01-01 00:00:00", line.rstrip()))


def matches(expected: list[str], actual: list[str]) -> bool:
    if not expected:
        return not actual
    if expected[0] == ANY_LINES:
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and normalised(expected[0]) == normalised(actual[0]) and matches(expected[1:], actual[1:])


def script(steps: list[Step]) -> str:
    lines = ["exec 2>&1"]
    for i, step in enumerate(steps):
        lines += [f"echo '@@STEP {i}@@'", step.command, f'echo "@@RC {i} $?@@"']
    return "\n".join(lines) + "\n"


def clone_like(tmp: Path) -> Path:
    """A directory a newcomer would run from: manage.py and the virtual environment, and nothing else of
    ours (the data dir, var/, is created fresh by the first command)."""
    where = tmp / "clone"
    where.mkdir()
    (where / "manage.py").symlink_to(ROOT / "manage.py")
    (where / ".venv").symlink_to(ROOT / ".venv")
    return where


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def end_group(pgid: int) -> None:
    """The walkthrough's background processes (master, shard) share the script's process group."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(AssertionError):
            wait_until(lambda: group_gone(pgid), timeout=wait_s, what="the walkthrough's processes to end")
            return


def test_the_readme_walkthrough_runs_as_written(tmp_path):
    steps = walkthrough()
    assert len(steps) > 10 and sum(bool(s.expected) for s in steps) > 8
    port = free_port()
    where = clone_like(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSHARD_", "DJANGO_", "DATABASE_URL"))}
    env.update(
        FLEETSHARD_SERVER=f"http://127.0.0.1:{port}",
        FLEETSHARD_HEARTBEAT_INTERVAL_S="1",
        FLEETSHARD_CGROUP_NAME=f"fleetshard-readme-{os.getpid()}",
        PATH=os.environ.get("PATH", "/usr/bin:/bin"),
    )
    text = script(steps).replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    for step in steps:
        step.expected = [line.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for line in step.expected]
    proc = subprocess.Popen(
        ["bash", "-c", text],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=180)
        # The master the walkthrough started still serves: the admin it points at works as it says.
        admin = admin_pages(f"http://127.0.0.1:{port}", steps)
    finally:
        end_group(proc.pid)
    logs = "\n".join(f"--- {p.name}:\n{p.read_text()[-3000:]}" for p in sorted((where / "var").glob("*.log")))
    outputs = re.split(r"^@@STEP \d+@@\n", out, flags=re.M)[1:]
    assert len(outputs) == len(steps), f"the script stopped early:\n{out}\n{logs}"
    for i, (step, output) in enumerate(zip(steps, outputs, strict=True)):
        body, rc_line = output.rsplit("@@RC", 1)
        rc = int(rc_line.split()[1].rstrip("@"))
        actual = body.splitlines()
        assert rc == 0, f"step {i}: {step.command!r} exited {rc}:\n{body}\n{logs}"
        if step.expected:
            assert matches(step.expected, actual), (
                f"step {i}: {step.command!r} printed:\n" + "\n".join(actual) + "\nthe README shows:\n"
                + "\n".join(step.expected) + f"\n{logs}"
            )  # fmt: skip
    assert admin["login"] == 302 and admin["index"] == 200, admin
    assert admin["entries"] == 200 and admin["chart"] == 200 and "BM_copy" in admin["chart_text"], admin


def admin_pages(server: str, steps: list[Step]) -> dict[str, Any]:
    """Logs into the admin as the walkthrough's set_password step says, then opens the benchmark chart of
    the walkthrough's job; the status of each page (and the chart's text)."""
    (command,) = [s.command for s in steps if "set_password" in s.command]
    password = re.search(r"echo '([^']+)'", command)
    assert password is not None, command
    session = requests.Session()
    session.get(f"{server}/admin/login/", timeout=10)
    login = session.post(
        f"{server}/admin/login/?next=/admin/",
        data={
            "username": "alice",
            "password": password[1],
            "csrfmiddlewaretoken": session.cookies.get("csrftoken", ""),
            "next": "/admin/",
        },
        headers={"Referer": f"{server}/admin/login/"},
        allow_redirects=False,
        timeout=10,
    )
    index = session.get(f"{server}/admin/", timeout=10)
    entries = session.get(f"{server}/admin/benchmarks/entries/", params={"test": "copy"}, timeout=10)
    chart = session.get(f"{server}/admin/benchmarks/chart/", params={"test": "copy", "entry": "BM_copy"}, timeout=10)
    return {
        "login": login.status_code,
        "index": index.status_code,
        "entries": entries.status_code,
        "chart": chart.status_code,
        "chart_text": chart.text,
    }
