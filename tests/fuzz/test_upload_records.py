"""Hostile result files, job traces and log chunks, sent through a real shard's uploader (shard/uploads/
results.py, shard/uploads/logs.py) to a real master process (issue 23, finding 1).

Each case is one run of its own HQE: a job trace and a result file built from hostile values
(non-finite and overflowing aggregates, NUL and lone surrogates in every key and value, deep
nesting, broken JSON), a good result file after them, and a log whose first chunk is hostile bytes
and whose second is good. Whatever the case, the master never answers 5xx, the hostile records end
archived or quarantined (never left to block), and the good records after them always arrive.

`make test` runs FLEETSHARD_FUZZ_UPLOAD_CASES (24) derandomised cases; `make fuzz` raises the count
and randomises (tests/fuzz/tally.py).
"""

import json
import random
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from shard.run.workspace import QUARANTINE, TRACE
from shard.uploads.logs import LogRefused, LogSender
from shard.uploads.record_tries import RecordTries
from shard.uploads.results import Sender, upload_run
from tests.fuzz import tally
from tests.fuzz.test_heartbeat_bodies import HOSTILE
from tests.shard.fleet import new_shard, sql, submit
from tests.shard.uploads.test_results_upload import listing, make_run, owners, tf_file
from tests.support import Master

BAD_KEYS = ["\x00", "a\x00b", "\ud800", "x\udfffy", "\ufffd", "k" * 300, "", "real_time", "iterations", "name"]
OVERFLOWING = [1.7e308, -1.7e308, 2**63 - 1, 2**63, 10**400]
GB_FIELDS = [
    "name", "run_name", "run_type", "real_time", "cpu_time", "iterations", "time_unit", "label",
    "aggregate_name", "error_occurred", "error_message", "bytes_per_second", "repetitions",
]  # fmt: skip
TF_FIELDS = ["name", "iters", "wallTime", "cpuTime", "throughput", "extras", "metrics"]
# Names a job may give its file (sorted before the good file's): invalid UTF-8, controls, long.
BAD_NAMES = ["a-hostile.json", "a-\udcff.json", "a-\u202e.json", "a-\x1b[2J\n.json", "a-" + "n" * 240 + ".json"]
BAD_BYTES = [b"\x00", b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"x" * 70_000, b"\x1b[2J\r\n", "\u202e".encode()]


def deep(n: int = 40) -> Any:
    return json.loads("[" * n + "]" * n)


def value(rng: random.Random) -> Any:
    return rng.choice([*HOSTILE, *OVERFLOWING, deep(), "\ud800", float("inf"), float("nan")])


def rep(name: str = "BM_X", **fields: Any) -> dict[str, Any]:
    return {"name": name, "run_name": name, "run_type": "iteration", "iterations": 10, "real_time": 1.0, **fields}


def hostile_result(rng: random.Random, start: int) -> bytes:
    """A Google Benchmark or TensorFlow file with one hostile part; sometimes not JSON at all."""
    context = {"date": "2024-01-02T03:04:05Z", "executable": "/b/fuzz_bench"}
    pick = rng.randrange(9)
    if pick == 0:  # repetitions whose median or sum overflows
        field, big = rng.choice([("real_time", 1.7e308), ("iterations", 2**63 - 1), ("items_per_second", 1.7e308)])
        doc: dict[str, Any] = {"context": context, "benchmarks": [rep(**{field: big, "time_unit": "s"})] * 2}
    elif pick == 1:  # a hostile key in a row, the context or the document
        where = rng.choice(["row", "context", "doc"])
        row = rep()
        doc = {"context": dict(context), "benchmarks": [row]}
        target = row if where == "row" else doc["context"] if where == "context" else doc
        target[rng.choice(BAD_KEYS)] = value(rng)
    elif pick == 2:  # a hostile value in a known field of a row
        doc = {"context": context, "benchmarks": [rep(**{rng.choice(GB_FIELDS): value(rng)})]}
    elif pick == 3:  # a hostile context
        doc = {"context": {**context, rng.choice(["date", "executable"]): value(rng)}, "benchmarks": [rep()]}
    elif pick == 4:  # TensorFlow: a hostile extra or metric, key and value
        key, inner = rng.choice(BAD_KEYS), rng.choice(["doubleValue", "stringValue"])
        entry = {"name": "e", "wallTime": 1.0, "extras": {key: {inner: value(rng)}}}
        if rng.random() < 0.5:
            entry = {"name": "e", "wallTime": 1.0, "metrics": [{"name": key, "value": value(rng)}]}
        doc = {"name": "fuzz_tf", "startTime": str(start), "entries": {"entry": [entry]}}
    elif pick == 5:  # TensorFlow: a hostile field of an entry, or of the document
        entry = {"name": "e", "wallTime": 1.0, rng.choice(TF_FIELDS): value(rng)}
        doc = {"name": "fuzz_tf", "startTime": str(start), "entries": {"entry": [entry]}}
        if rng.random() < 0.3:
            doc[rng.choice(["name", "startTime", rng.choice(BAD_KEYS)])] = value(rng)
    elif pick == 6:  # deep nesting wherever a value may be
        doc = {"context": {**context, "nest": deep(rng.choice([31, 33, 200]))}, "benchmarks": [rep()]}
    elif pick == 7:  # two repetitions, each with a hostile extra key (NUL, surrogates)
        key = rng.choice(BAD_KEYS)
        doc = {"context": context, "benchmarks": [rep(**{key: 1.5}), rep(**{key: 2.5})]}
    else:  # not JSON, or JSON that no decoder should take
        return rng.choice([b"{", b"\xff" * 10, b'{"context": NaN}', b"[" * 100_000, b'{"a": "\\ud800"}', b""])
    return json.dumps(doc).encode()


def hostile_trace(rng: random.Random) -> bytes:
    event: dict[str, Any] = {"ph": "X", "ts": 0, "dur": 1, "name": "n", "pid": 1, "tid": 1}
    event[rng.choice([*BAD_KEYS, "ts", "dur", "name", "cat", "pid", "tid", "ph"])] = value(rng)
    shape = rng.randrange(4)
    if shape == 0:
        return json.dumps({"traceEvents": [event]}).encode()
    if shape == 1:
        return json.dumps([event, {"ph": "B", "ts": value(rng)}, {"ph": "E", "ts": value(rng)}]).encode()
    if shape == 2:
        return json.dumps({"traceEvents": deep(rng.choice([31, 40]))}).encode()
    return rng.choice(BAD_BYTES)


@pytest.fixture
def hqes(master_server: Master, tmp_path: Path) -> tuple[str, list[int]]:
    """A shard's token and one HQE of its own per case, each with the host that ran it."""
    shard = new_shard(master_server, tmp_path, hosts=1)
    jobs = submit(
        master_server,
        [{"name": f"fuzz{i}", "command": "true", "meta_hosts": [[shard.label, 1]]} for i in range(tally.UPLOAD_CASES)],
    )
    (host_id,) = shard.hosts.values()
    ids = master_server.shell(
        "from common.models import HostQueueEntry\n"
        f"found = HostQueueEntry.objects.filter(job_id__in={jobs!r})\n"
        f"found.update(host_id={host_id})\n"
        "result = sorted(found.values_list('id', flat=True))"
    )
    return shard.process.role.extra_env["FLEETSHARD_SHARD_TOKEN"], ids


@pytest.mark.e2e
def test_hostile_records_through_a_real_uploader_never_5xx_nor_hold_back_a_good_one(master_server, tmp_path, hqes):
    token, hqe_ids = hqes
    seed = 23 if tally.DERANDOMIZE else random.randrange(2**32)
    rng = random.Random(seed)
    codes: list[int] = []
    sender = Sender(master_server.url, token, timeout_s=30)
    logs = LogSender(master_server.url, token, 30)
    for session in (sender.session, logs.session):
        session.hooks["response"].append(lambda resp, *args, **kwargs: codes.append(resp.status_code))
    tries = RecordTries(2, lambda: 0.0, lambda: None)
    tag = uuid.uuid4().hex[:8]
    failures: list[str] = []
    for i, hqe_id in enumerate(hqe_ids):
        before = len(codes)
        start = 1_700_000_000 + i
        hostile_name = rng.choice(BAD_NAMES)
        files = {hostile_name: hostile_result(rng, start), "b-good.json": tf_file(f"good-{tag}-{i}", start)}
        run = make_run(tmp_path / f"case{i}", files)
        (run / TRACE).write_bytes(hostile_trace(rng))
        done = upload_run(run, hqe_id, sender, owners(), threading.Event(), tries)
        problems = []
        if not done or listing(run / "results"):
            problems.append(f"left behind: {listing(run / 'results')}")
        if "b-good.json" in listing(run / QUARANTINE):
            problems.append("the good file was quarantined")
        chunk = rng.choice(BAD_BYTES) * rng.choice([1, 3])
        try:
            first = logs.send(hqe_id, 0, chunk, final=False)
            last = logs.send(hqe_id, first.size, b"good line\n", final=True)
            if (last.size, last.complete) != (len(chunk) + len(b"good line\n"), True):
                problems.append(f"the good log chunk did not land after the hostile one: {last}")
        except LogRefused as exc:
            problems.append(f"a log chunk was refused: {exc}")
        answered = codes[before:]
        problems += [f"HTTP {code}" for code in answered if code >= 500]
        tally.UPLOADS.cases += 3
        tally.UPLOADS.statuses.update(answered)
        if problems:
            described = f"case {i} (seed {seed}): {problems}; file {hostile_name!r}: {files[hostile_name][:200]!r}"
            tally.UPLOADS.fail(described)
            failures.append(described)
    stored = sql(
        master_server.role.database_url, "SELECT test FROM master_testrun WHERE test LIKE %s", (f"good-{tag}-%",)
    )
    missing = {f"good-{tag}-{i}" for i in range(len(hqe_ids))} - {test for (test,) in stored}
    assert not missing, f"good files that never arrived: {sorted(missing)}"
    assert not failures, "\n".join(failures[:5])
