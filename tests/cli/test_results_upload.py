"""`fleetshard results upload`: a spool directory of result files to the master, from cron, several at once."""

import copy
import fcntl
import json
import os
import pty
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result

from cli.main import main
from common.constants import MAX_RESULT_FILE_BYTES
from master.models import TestRun
from tests.cli.conftest import fails, ok
from tests.master.results.test_formats import GB_SAMPLE, TF_SAMPLE
from tests.support import ROOT, assert_status, wait_until

T0 = 1_700_000_000


def tf_doc(n: int, test: str = "upl_tf") -> dict:
    doc = copy.deepcopy(TF_SAMPLE)
    doc["name"], doc["startTime"] = test, str(T0 + n)
    return doc


def gb_doc(n: int, test: str = "upl_gb") -> dict:
    doc = copy.deepcopy(GB_SAMPLE)
    doc["context"]["executable"] = f"/build/bench/{test}"
    doc["context"]["date"] = (datetime.fromtimestamp(T0, UTC) + timedelta(seconds=n)).isoformat()
    return doc


def put(directory: Path, name: str, content: bytes | dict, age_s: float = 0) -> Path:
    """A result file as a writer leaves it, `age_s` seconds old (the uploader takes the oldest first)."""
    path = directory / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    when = T0 + 10_000_000 - age_s
    os.utime(path, (when, when))
    return path


def spool(directory: Path, count: int) -> list[str]:
    """`count` files, alternately TensorFlow and Google Benchmark, each a distinct run; oldest first."""
    names = []
    for n in range(count):
        name = f"r{n:03d}-{'tf' if n % 2 == 0 else 'gb'}.json"
        put(directory, name, tf_doc(n) if n % 2 == 0 else gb_doc(n), age_s=count - n)
        names.append(name)
    return names


def upload(url: str, token: str | None, data: Path, *more: str) -> Result:
    env = {"FLEETSHARD_SERVER": url, "FLEETSHARD_TOKEN": token}
    args = ["results", "upload", "--data-dir", str(data), "--archive-dir", str(data.parent / "archive"), *more]
    return CliRunner().invoke(main, args, env=env, prog_name="fleetshard")


@pytest.fixture
def spooldir(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    path.mkdir()
    return path


def listing(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.exists() else []


# Without a master: what is refused or set aside before any upload.


def test_master_down_keeps_the_files_and_stops_at_the_first(spooldir, dead_server):
    names = spool(spooldir, 3)
    result = upload(dead_server, "fs_any", spooldir)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"kept {names[0]}: cannot reach the fleetshard server at {dead_server}")
    assert lines[1:] == ["0 uploaded, 0 quarantined, 1 kept, 0 skipped, 2 not tried (stopped)"]
    assert result.stderr.startswith(f"Error: 3 files not uploaded, left in {spooldir} for the next run: cannot reach")
    assert result.stderr.count("\n") == 1
    assert listing(spooldir) == names and listing(spooldir.parent / "archive") == []


def test_master_down_json_lists_the_kept_file(spooldir, dead_server):
    spool(spooldir, 1)
    result = upload(dead_server, "fs_any", spooldir, "--json")
    assert result.exit_code == 1
    [outcome] = json.loads(result.stdout)
    assert (outcome["file"], outcome["status"], outcome["moved_to"]) == ("r000-tf.json", "kept", None)
    assert outcome["reason"].startswith("cannot reach the fleetshard server")


def test_symlinks_and_other_non_regular_files_are_skipped_and_left(spooldir, tmp_path, dead_server):
    secret = put(tmp_path, "elsewhere.json", tf_doc(1))
    (spooldir / "link.json").symlink_to(secret)
    (spooldir / "dangling.json").symlink_to(tmp_path / "nothing")
    os.mkfifo(spooldir / "fifo.json")
    (spooldir / "dir.json").mkdir()
    (spooldir / "notes.txt").write_text("not a result")
    result = ok(upload(dead_server, "fs_any", spooldir))
    assert result.stdout.splitlines() == [
        "skipped dangling.json: a symbolic link, not followed",
        "skipped dir.json: not a regular file",
        "skipped fifo.json: not a regular file",
        "skipped link.json: a symbolic link, not followed",
        "0 uploaded, 0 quarantined, 0 kept, 4 skipped",
    ]
    assert listing(spooldir) == ["dangling.json", "dir.json", "fifo.json", "link.json", "notes.txt"]
    assert secret.exists() and listing(spooldir.parent / "archive") == []


def test_a_file_larger_than_the_master_takes_is_quarantined_without_an_upload(spooldir, dead_server):
    # The master is down: a quarantine here proves nothing was sent.
    put(spooldir, "huge.json", b" " * MAX_RESULT_FILE_BYTES + json.dumps(tf_doc(1)).encode())
    result = ok(upload(dead_server, "fs_any", spooldir))
    reason = f"huge.json: larger than {MAX_RESULT_FILE_BYTES} bytes: not uploaded"
    assert result.stdout.splitlines() == [
        f"quarantined huge.json: {reason.removeprefix('huge.json: ')}",  # the name once
        "0 uploaded, 1 quarantined, 0 kept, 0 skipped",
    ]
    assert listing(spooldir) == ["quarantine"]
    assert listing(spooldir / "quarantine") == ["huge.json", "huge.json.error"]
    assert (spooldir / "quarantine" / "huge.json.error").read_text() == reason + "\n"
    assert (spooldir / "quarantine" / "huge.json").stat().st_size == MAX_RESULT_FILE_BYTES + len(json.dumps(tf_doc(1)))


def test_a_file_another_uploader_holds_is_skipped(spooldir, dead_server):
    path = put(spooldir, "held.json", tf_doc(1))
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = ok(upload(dead_server, "fs_any", spooldir))
    assert result.stdout.splitlines() == [
        "skipped held.json: held by another uploader",
        "0 uploaded, 0 quarantined, 0 kept, 1 skipped",
    ]
    assert listing(spooldir) == ["held.json"]


def test_odd_file_names_are_shown_not_acted_on(spooldir, dead_server):
    (spooldir / "\x1b]0;pwned\x07\u202e.json").symlink_to("/etc/passwd")
    result = ok(upload(dead_server, "fs_any", spooldir))
    assert result.stdout.splitlines()[0] == "skipped \\x1b]0;pwned\\x07\\u202e.json: a symbolic link, not followed"
    assert (
        json.loads(ok(upload(dead_server, "fs_any", spooldir, "--json")).stdout)[0]["file"]
        == "\x1b]0;pwned\x07\u202e.json"
    )


def test_an_empty_directory_prints_nothing(spooldir, dead_server):
    assert ok(upload(dead_server, "fs_any", spooldir)).stdout == ""
    assert json.loads(ok(upload(dead_server, "fs_any", spooldir, "--json")).stdout) == []


def test_an_empty_directory_on_a_terminal_says_it_looked(spooldir, dead_server):
    """By hand, silence reads as a hang or a wrong directory; from cron (no terminal) it stays silent."""
    env = {**os.environ, "FLEETSHARD_SERVER": dead_server, "FLEETSHARD_TOKEN": "fs_any"}
    args = [sys.executable, "-m", "cli.main", "results", "upload", "--data-dir", str(spooldir), "--archive-dir",
            str(spooldir.parent / "archive")]  # fmt: skip
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    assert proc.wait(30) == 0
    os.close(leader)
    assert screen.decode().splitlines() == [f"No result files in {spooldir}."]


def test_bad_directories_and_no_token_are_refused_before_any_file_moves(spooldir, dead_server):
    spool(spooldir, 2)
    (spooldir.parent / "afile").write_text("")
    fails(upload(dead_server, None, spooldir), "Error: no API token: set FLEETSHARD_TOKEN")
    fails(
        upload(dead_server, "fs_any", spooldir, "--archive-dir", str(spooldir)),
        f"Error: invalid archive dir '{spooldir}': it is the data dir",
    )
    fails(
        upload(dead_server, "fs_any", spooldir, "--quarantine-dir", str(spooldir.parent / "afile")),
        f"Error: invalid quarantine dir '{spooldir.parent / 'afile'}': not a directory",
    )
    missing = spooldir.parent / "missing"
    fails(upload(dead_server, "fs_any", missing), "Directory '" + str(missing) + "' does not exist", code=2)
    assert listing(spooldir) == ["r000-tf.json", "r001-gb.json"]


def test_a_terminal_gets_a_progress_bar_and_a_pipe_does_not(spooldir, dead_server):
    paths = [put(spooldir, f"held{n}.json", tf_doc(n), age_s=10 - n) for n in range(2)]
    env = {**os.environ, "FLEETSHARD_SERVER": dead_server, "FLEETSHARD_TOKEN": "fs_any", "COLUMNS": "100"}
    args = [sys.executable, "-m", "cli.main", "results", "upload", "--data-dir", str(spooldir), "--archive-dir",
            str(spooldir.parent / "archive")]  # fmt: skip
    holds = [open(p, "rb") for p in paths]  # noqa: SIM115
    try:
        for held in holds:
            fcntl.flock(held, fcntl.LOCK_EX)
        leader, follower = pty.openpty()
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=follower, stderr=subprocess.PIPE)
        os.close(follower)
        screen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            screen += chunk
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
        os.close(leader)
        piped = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    finally:
        for held in holds:
            held.close()
    text = screen.decode()
    assert "uploading" in text and "2/2" in text and "#" in text
    assert "skipped held0.json: held by another uploader" in text
    assert piped.returncode == 0 and piped.stdout.splitlines() == [
        "skipped held0.json: held by another uploader",
        "skipped held1.json: held by another uploader",
        "0 uploaded, 0 quarantined, 0 kept, 2 skipped",
    ]


# Against a live master (the test server over loopback), uploaders as real processes.

live = pytest.mark.django_db(transaction=True)
BROKEN = {"name": "broken", "startTime": T0, "entries": {"entry": [{"name": "x", "wallTime": "fast"}]}}


def start_uploader(server, data: Path, *more: str, token: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "FLEETSHARD_SERVER": server.url, "FLEETSHARD_TOKEN": token or server.token}
    args = ["results", "upload", "--data-dir", str(data), "--archive-dir", str(data.parent / "archive"), *more]
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stored() -> list[tuple[str, datetime]]:
    return sorted(TestRun.objects.values_list("test", "start"))


@live
def test_two_uploaders_at_once_store_each_file_exactly_once(cli, server, spooldir):
    names = spool(spooldir, 200)
    put(spooldir, "broken.json", BROKEN, age_s=1000)
    procs = [start_uploader(server, spooldir, "--json") for _ in range(2)]
    finished = [proc.communicate(timeout=280) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in finished]
    outcomes = [o for out, _ in finished for o in json.loads(out)]
    uploaded = [o for o in outcomes if o["status"] == "uploaded"]
    print(
        "files uploaded by each uploader:",
        [sum(o["status"] == "uploaded" for o in json.loads(out)) for out, _ in finished],
    )
    assert sorted(o["file"] for o in uploaded) == names
    assert all(o["created"] for o in uploaded) and len({o["run"] for o in uploaded}) == 200
    assert [o["file"] for o in outcomes if o["status"] == "quarantined"] == ["broken.json"]
    assert {o["status"] for o in outcomes} <= {"uploaded", "quarantined", "skipped"}
    assert all(o["reason"] == "held by another uploader" for o in outcomes if o["status"] == "skipped")

    assert TestRun.objects.count() == 200
    assert len(set(stored())) == 200
    assert sorted(TestRun.objects.values_list("id", flat=True)) == sorted(o["run"] for o in uploaded)
    assert set(TestRun.objects.values_list("uploaded_by__username", "job", "hqe")) == {("boss", None, None)}
    tests = json.loads(ok(cli("results", "tests", "--json")).stdout)
    assert sorted((t["test"], t["runs"]) for t in tests) == [("upl_gb", 100), ("upl_tf", 100)]
    archive = spooldir.parent / "archive"
    assert listing(spooldir) == ["quarantine"] and listing(archive) == names
    assert listing(spooldir / "quarantine") == ["broken.json", "broken.json.error"]
    reason = (spooldir / "quarantine" / "broken.json.error").read_text()
    assert reason.startswith("broken.json: ") and "wallTime" in reason
    assert (archive / names[7]).read_bytes() == json.dumps(gb_doc(7)).encode()

    again = start_uploader(server, spooldir)
    assert again.communicate(timeout=60) == ("", "") and again.returncode == 0
    assert TestRun.objects.count() == 200


@live
def test_the_same_files_again_are_archived_beside_the_first_without_new_runs(server, spooldir):
    archive = spooldir.parent / "archive"
    names = spool(spooldir, 3)
    first = ok(upload(server.url, server.token, spooldir)).stdout.splitlines()
    run = TestRun.objects.get(test="upl_tf", start=datetime.fromtimestamp(T0, UTC)).id
    assert [line.split(":")[0] for line in first[:3]] == [f"uploaded {name}" for name in names]
    assert first[0] == f"uploaded r000-tf.json: run {run} (2 entries)"
    assert first[3] == "3 uploaded, 0 quarantined, 0 kept, 0 skipped"
    spool(spooldir, 3)
    again = ok(upload(server.url, server.token, spooldir)).stdout.splitlines()
    assert again[0] == f"uploaded r000-tf.json: run {run} (2 entries), already stored"
    assert TestRun.objects.count() == 3 and listing(spooldir) == []
    clashes = [name for name in listing(archive) if name not in names]
    assert len(listing(archive)) == 6 and all(name.endswith(".json") for name in clashes)
    assert sorted(name.split(".")[0] for name in clashes) == [name.split(".")[0] for name in names]
    assert all((archive / c).read_bytes() == (archive / (c.split(".")[0] + ".json")).read_bytes() for c in clashes)


@live
def test_killed_between_upload_and_move_the_next_run_archives_without_a_duplicate(server, spooldir):
    # The state a kill after the upload leaves: the master has the run, the file is still in the data dir.
    path = put(spooldir, "done.json", tf_doc(5))
    answer = requests.post(
        f"{server.url}/api/v1/results/upload",
        params={"name": "done.json"},
        data=path.read_bytes(),
        headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert_status(answer, 201)
    result = json.loads(ok(upload(server.url, server.token, spooldir, "--json")).stdout)
    assert [(o["file"], o["status"], o["created"], o["run"]) for o in result] == [
        ("done.json", "uploaded", False, answer.json()["run"]["id"])
    ]
    assert TestRun.objects.count() == 1 and listing(spooldir.parent / "archive") == ["done.json"]


@live
def test_an_uploader_killed_anywhere_loses_and_duplicates_nothing(server, spooldir):
    names = spool(spooldir, 120)
    archive = spooldir.parent / "archive"
    for kill in range(1, 4):
        proc = start_uploader(server, spooldir)
        wait_until(lambda n=kill: len(listing(archive)) >= 10 * n, timeout=60, what=f"{10 * kill} files archived")
        proc.kill()
        proc.communicate(timeout=30)
    assert listing(spooldir), "the uploader finished before it was killed: spool more files"
    ok(upload(server.url, server.token, spooldir))
    assert listing(spooldir) == [] and listing(archive) == names
    assert TestRun.objects.count() == 120 and len(set(stored())) == 120


@live
def test_refused_token_and_missing_permission_keep_the_files(server, spooldir):
    names = spool(spooldir, 2)
    result = upload(server.url, "fs_wrong", spooldir)
    assert result.exit_code == 1 and "refused the token" in result.stdout.splitlines()[0]
    assert result.stdout.splitlines()[0].startswith("kept r000-tf.json: ")
    result = upload(server.url, server.user_token, spooldir)
    assert result.exit_code == 1 and result.stdout.splitlines()[0].startswith("kept r000-tf.json: permission denied")
    assert result.stderr.startswith(f"Error: 2 files not uploaded, left in {spooldir} for the next run: permission")
    assert listing(spooldir) == names and TestRun.objects.count() == 0


@live
def test_the_master_down_then_back(server, spooldir, dead_server):
    names = spool(spooldir, 4)
    assert upload(dead_server, server.token, spooldir).exit_code == 1
    assert listing(spooldir) == names and TestRun.objects.count() == 0
    ok(upload(server.url, server.token, spooldir))
    assert listing(spooldir) == [] and TestRun.objects.count() == 4


@live
def test_a_malformed_file_goes_to_the_named_quarantine_dir_with_the_masters_reason(server, spooldir, tmp_path):
    put(spooldir, "bad.json", BROKEN, age_s=2)
    put(spooldir, "good.json", gb_doc(1), age_s=1)
    put(spooldir, "notjson.json", b"{nope", age_s=0)
    quarantine = tmp_path / "q" / "deep"
    quarantine.mkdir(parents=True)
    (quarantine / "notjson.json").write_text("an earlier one")
    lines = ok(upload(server.url, server.token, spooldir, "--quarantine-dir", str(quarantine))).stdout.splitlines()
    bad_reason = (quarantine / "bad.json.error").read_text().rstrip("\n")
    assert bad_reason.startswith("bad.json: ")  # the .error note keeps the master's words
    assert lines[0] == f"quarantined bad.json: {bad_reason.removeprefix('bad.json: ')}"  # the name said once
    assert lines[1].startswith("uploaded good.json: run ")
    assert lines[2].startswith("quarantined notjson.json: ") and "notjson.json: notjson.json" not in lines[2]
    [clash, clash_error] = [name for name in listing(quarantine) if name.startswith("notjson.2")]
    assert listing(quarantine) == sorted(["bad.json", "bad.json.error", "notjson.json", clash, clash_error])
    assert clash_error == clash + ".error" and clash.endswith(".json")
    assert (quarantine / "notjson.json").read_text() == "an earlier one"
    assert (quarantine / clash).read_bytes() == b"{nope"
    assert listing(spooldir) == [] and TestRun.objects.count() == 1


@live
@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tempfile.gettempdir()).st_dev,
    reason="needs /dev/shm on another file system than the temporary directory",
)
def test_an_archive_on_another_file_system_keeps_the_file_and_stops(server, spooldir):
    names = spool(spooldir, 2)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as elsewhere:
        result = upload(server.url, server.token, spooldir, "--archive-dir", elsewhere)
        assert result.exit_code == 1 and listing(Path(elsewhere)) == []
    assert result.stdout.splitlines()[0] == (
        f"kept {names[0]}: uploaded, but cannot move it to {elsewhere} is not on the data dir's file system "
        "(files are moved with one rename)"
    )
    assert listing(spooldir) == names and TestRun.objects.count() == 1
    again = ok(upload(server.url, server.token, spooldir)).stdout.splitlines()
    assert again[0].endswith("already stored") and again[1].startswith(f"uploaded {names[1]}: ")
    assert listing(spooldir) == [] and TestRun.objects.count() == 2


@live
def test_one_entry_is_one_entry(server, spooldir):
    doc = {"name": "one", "startTime": T0, "entries": {"entry": [{"name": "x", "wallTime": 1.0}]}}
    put(spooldir, "one.json", doc)
    line = ok(upload(server.url, server.token, spooldir)).stdout.splitlines()[0]
    assert line.startswith("uploaded one.json: run ") and line.endswith(" (1 entry)")
