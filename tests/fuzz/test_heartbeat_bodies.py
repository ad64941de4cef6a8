"""Whole heartbeat bodies, valid, nearly valid and hostile, against the real endpoint and database.

Each case is one request built from a world of two shards with hosts and jobs in every HQE status
(tests/conftest.py `Fleet`). Whatever it sends, the master answers 200, 400, 401, 403, 409 or 413 and
never 5xx; a 4xx changes nothing (a checksum over every row of fleetshard's tables); a 200 acks every
update exactly once, in order, and keeps the invariants: a terminal HQE never changes, no HQE, job or
host of another shard changes, and an HQE changes only as its last accepted update says (or, when a
new instance replaces a silent one, to Failed/infra).

Every case runs in a savepoint that is rolled back, so cases are independent and replayable. Failing
cases are counted, not stopped at: tests/fuzz/tally.py prints the counts (`make fuzz`).
"""

import json
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from common.constants import FailureClass, HostStatus, HQEStatus
from common.models import Host, HostQueueEntry, Job, Shard
from master import services
from tests.conftest import Fleet, Heartbeat
from tests.fuzz import tally
from tests.fuzz.checksum import database_checksum
from tests.support import assert_status

ALLOWED = {200, 400, 401, 403, 409, 413}
BIG = 10 * 1024 * 1024 + 1

# Values no field should hold: out of range, wrong type, NUL, lone surrogates, deep nesting, too long.
HOSTILE: list[Any] = [
    0,
    -1,
    2**31,
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**30,
    True,
    False,
    1.0,
    1.5,
    -0.0,
    1e308,
    float("inf"),
    float("nan"),
    "1",
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\ufffd",
    "x" * 300,
    "y" * 70_000,
    None,
    [],
    [1],
    {},
    {"id": 1},
    json.loads("[" * 40 + "]" * 40),
    json.loads('{"a":' * 33 + "1" + "}" * 33),
]
hostile = st.sampled_from(HOSTILE)


def mostly(normal: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int = 8) -> st.SearchStrategy[Any]:
    """`normal` in about `odds` cases out of 10, else `rare`; shrinks towards `normal`.

    The rare band sits in the middle of the range: Hypothesis favours the ends of integer ranges.
    """
    low = 40
    high = low + (10 - odds) * 10
    return st.integers(0, 99).flatmap(lambda n: rare if low <= n < high else normal)


def rarely(chance_in_100: int) -> st.SearchStrategy[bool]:
    """True in about `chance_in_100` cases of 100 (in the middle of the range, for the same reason)."""
    return st.integers(0, 99).map(lambda n: 40 <= n < 40 + chance_in_100)


@dataclass
class World:
    """What a body may name: each shard's hosts, jobs and HQEs (in every status), and ids that exist nowhere."""

    fleet: Fleet
    tokens: dict[str, str | None]
    instance: dict[str, str]
    hosts: dict[str, list[int]]
    jobs: dict[str, list[int]]
    hqes: dict[str, list[int]]
    missing: list[int] = field(default_factory=list)

    def all(self, kind: str) -> list[int]:
        return sorted({i for ids in getattr(self, kind).values() for i in ids} | set(self.missing))


def build_world(fleet: Fleet, heartbeat: Heartbeat) -> World:
    """Both shards with queued, starting, running and ended HQEs, reached through the real endpoint."""
    lab1_jobs = [fleet.job(f"q{i}", meta_hosts=[("board:a", 2)]) for i in range(2)]
    lab1_jobs += [fleet.job(f"n{i}", meta_hosts=[], hosts=["a2"]) for i in range(4)]
    lab2_jobs = [fleet.job(f"b{i}", meta_hosts=[("board:b", 1)]) for i in range(3)]
    a1, a2, b1 = (Host.objects.get(hostname=h).id for h in ("a1", "a2", "b1"))
    h = [j.hqes.order_by("id").first() for j in lab1_jobs]
    heartbeat(
        fleet.lab1,
        fleet.token1,
        updates=[
            {"seq": 1, "hqe": h[0].id, "status": "Running", "host": a1},
            {"seq": 2, "hqe": h[2].id, "status": "Starting", "host": a2},
            {"seq": 3, "hqe": h[3].id, "status": "Completed", "host": a2, "exit_code": 0},
            {"seq": 4, "hqe": h[4].id, "status": "Failed", "failure": "test", "exit_code": 3},
        ],
    )
    services.abort_jobs([lab1_jobs[5].id], acting_user=None)
    g = [j.hqes.get() for j in lab2_jobs]
    heartbeat(
        fleet.lab2,
        fleet.token2,
        updates=[
            {"seq": 1, "hqe": g[0].id, "status": "Running", "host": b1},
            {"seq": 2, "hqe": g[1].id, "status": "Completed", "host": b1, "exit_code": 0},
        ],
    )
    by_shard = {"lab1": fleet.lab1, "lab2": fleet.lab2}
    top = max(HostQueueEntry.objects.order_by("-id").values_list("id", flat=True)[:1] or [0])
    return World(
        fleet=fleet,
        tokens={
            "lab1": fleet.token1,
            "lab2": fleet.token2,
            "personal": services.create_personal_token("fuzzboss", admin=True, acting_user=None)[1],
            "unknown": "fs_" + "0" * 43,
            "none": None,
        },
        instance={name: Heartbeat.instance_of(name) for name in by_shard},
        hosts={name: list(Host.objects.filter(shard=s).values_list("id", flat=True)) for name, s in by_shard.items()}
        | {"unassigned": list(Host.objects.filter(shard=None).values_list("id", flat=True))},
        jobs={name: list(Job.objects.filter(shard=s).values_list("id", flat=True)) for name, s in by_shard.items()},
        hqes={
            name: list(HostQueueEntry.objects.filter(job__shard=s).values_list("id", flat=True))
            for name, s in by_shard.items()
        },
        missing=[top + 1000, 2**63 - 1],
    )


def _times() -> st.SearchStrategy[Any]:
    when = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2110, 1, 1), timezones=st.just(UTC))
    return mostly(
        when.map(lambda t: t.isoformat().replace("+00:00", "Z")),
        st.sampled_from(["2026-11-22T10:00:00", "yesterday", "2026-13-40T99:00:00Z", "9999-12-31T23:59:59-23:59"])
        | hostile,
    )


def _text() -> st.SearchStrategy[Any]:
    return mostly(
        st.text(max_size=40),
        st.sampled_from(["\x00", "ok\x00", "\ud800", "tail\udc00", "z" * 20_000, "é" * 17_000]) | hostile,
    )


@st.composite
def updates(draw: st.DrawFn, world: World, rough: bool) -> list[dict[str, Any]]:
    """An outbox: mostly sound updates of this or the other shard's HQEs; a `rough` one may break its seqs."""
    hqe_ids = world.all("hqes")
    host_ids = world.all("hosts")
    job_ids = world.all("jobs")
    count = draw(st.integers(0, 8))
    # Seqs: from below the ones already applied (duplicates) to far above; usually growing.
    seq = draw(st.sampled_from([0, 1, 2, 3, 10, 1000, 2**62]))
    result = []
    for _ in range(count):
        seq_mode = draw(st.integers(0, 99)) if rough else 0
        if not 40 <= seq_mode < 50:
            seq += draw(st.integers(1, 3))
            seq_value: Any = seq
        elif seq_mode < 47:
            seq_value = seq  # repeated or not growing: the whole body is a 400
        else:
            seq_value = draw(hostile)
        status = draw(mostly(st.sampled_from(HQEStatus.ALL), hostile, odds=9))
        update: dict[str, Any] = {"seq": seq_value, "hqe": draw(mostly(st.sampled_from(hqe_ids), hostile, odds=9))}
        update["status"] = status
        if status == HQEStatus.FAILED:
            update["failure"] = draw(mostly(st.sampled_from(FailureClass.ALL), hostile | st.just("crash")))
        elif draw(rarely(5)):
            update["failure"] = draw(st.sampled_from(FailureClass.ALL) | hostile)
        optional = {
            "job": mostly(st.sampled_from(job_ids), hostile),
            "host": mostly(st.sampled_from(host_ids), hostile),
            "exit_code": mostly(st.integers(-(2**31), 2**31 - 1), hostile),
            "started_on": _times(),
            "finished_on": _times(),
            "log_tail": _text(),
            "from_a_newer_client": st.just({"nested": [1, 2]}) | hostile,
        }
        for key, strategy in optional.items():
            if draw(st.booleans()):
                update[key] = draw(strategy)
        if not rough and draw(st.booleans()):
            # A sound update of this shard's own HQE, so that many bodies also apply something.
            update = {"seq": seq_value, "hqe": draw(st.sampled_from(world.hqes["lab1"])), "status": status}
            if status == HQEStatus.FAILED:
                update["failure"] = draw(st.sampled_from(FailureClass.ALL))
        result.append(update)
    return result


@dataclass
class Case:
    """One request: the token it carries, its raw body, and whether the shard's instance fell silent first."""

    token: str | None
    raw: bytes
    body: Any
    silent: bool = False
    scheme: str = "Bearer"

    def show(self) -> str:
        text = self.raw[:1500].decode("utf-8", "replace")
        return f"token={self.token!r} scheme={self.scheme} silent={self.silent} body[{len(self.raw)}]={text}"


@st.composite
def cases(draw: st.DrawFn, world: World) -> Case:
    """A whole request. Four in ten are `rough`: hostile values may then appear anywhere in the envelope
    (a 400 at best); the others are sound envelopes whose updates may still be wrong in every way."""
    rough = draw(rarely(40))

    def envelope(normal: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int = 9) -> Any:
        return draw(mostly(normal, rare, odds) if rough else normal)

    shard = envelope(st.just("lab1"), st.sampled_from(["lab2", "lab3"]) | hostile)
    token_name = draw(mostly(st.just("lab1"), st.sampled_from(["lab2", "personal", "unknown", "none"]), odds=9))
    if token_name == "lab2" and draw(st.booleans()):
        shard = "lab2"  # a sound heartbeat of the other shard: lab1 is then "the other one"
    mine = shard if isinstance(shard, str) and shard in world.instance else "lab1"
    # Mostly the shard's own instance; sometimes another (a 409 unless the shard fell silent).
    instance = draw(
        mostly(
            st.just(world.instance[mine]),
            st.sampled_from([str(uuid.UUID(int=7)), world.instance[mine].upper()])
            | (st.sampled_from(["not-a-uuid"]) | hostile if rough else st.nothing()),
            odds=8,
        )
    )
    host_ids, job_ids = world.all("hosts"), world.all("jobs")
    body: dict[str, Any] = {
        "protocol": envelope(st.just(1), st.sampled_from([2, 0, -1, "1", 1.0, True, None])),
        "shard": shard,
        "instance": instance,
        "client_version": envelope(st.text(max_size=10), st.just("v" * 65) | hostile),
        "known_hosts": draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.sampled_from(host_ids) if not rough else mostly(st.sampled_from(host_ids), hostile),
                        "version": st.integers(1, 5) if not rough else mostly(st.integers(1, 5), hostile),
                        "status": st.sampled_from(HostStatus.ALL),
                    }
                ),
                max_size=5,
                # A sound body lists each host and job once; a rough one may list one twice (a 400).
                unique_by=None if rough else (lambda entry: entry["id"]),
            )
        ),
        "known_jobs": draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.sampled_from(job_ids) if not rough else mostly(st.sampled_from(job_ids), hostile),
                        "version": st.integers(1, 5),
                    }
                ),
                max_size=5,
                # A sound body lists each host and job once; a rough one may list one twice (a 400).
                unique_by=None if rough else (lambda entry: entry["id"]),
            )
        ),
        "updates": draw(updates(world, rough)),
    }
    if rough and draw(rarely(20)) and body["known_hosts"]:
        body["known_hosts"][0]["status"] = draw(hostile | st.just("Broken"))
    # Now and then: a field missing, replaced wholesale, or an unknown one added.
    tweak = draw(st.integers(0, 99)) if rough else 0
    if tweak == 40:
        del body[draw(st.sampled_from(sorted(body)))]
    elif tweak == 41:
        body[draw(st.sampled_from(sorted(body)))] = draw(hostile)
    elif tweak == 42:
        body["future_field"] = draw(hostile)
    silent = draw(rarely(10))
    scheme = envelope(st.just("Bearer"), st.sampled_from(["bearer", "Basic", "Token"]))
    token = world.tokens[token_name]
    shape = draw(st.integers(0, 99)) if rough else 0
    if shape in (40, 41):
        raw = draw(st.sampled_from([b"", b"{", b"\xff\xfe", b"null", b"[]", b'"x"', b"1" * 5000, b"{}" * 3]))
    elif shape == 42:
        raw = ("[" * 100_000 + "]" * 100_000).encode()
    elif shape == 43:
        raw = b'{"pad": "' + b"x" * BIG + b'"}'
    elif shape in (44, 45):
        # The same seq twice in one body: a 400.
        body["updates"] = body["updates"][:1] * 2
        raw = json.dumps(body).encode()
    else:
        raw = json.dumps(body).encode()
    return Case(token=token, raw=raw, body=body, silent=silent, scheme=scheme)


def _rows() -> dict[str, dict[int, dict[str, Any]]]:
    return {
        "host": {r["id"]: r for r in Host.objects.values()},
        "job": {r["id"]: r for r in Job.objects.values()},
        "hqe": {r["id"]: r for r in HostQueueEntry.objects.values()},
        "shard": {r["id"]: r for r in Shard.objects.values()},
    }


def _job_shard(job_id: int, rows: dict[str, dict[int, dict[str, Any]]]) -> int | None:
    return rows["job"][job_id]["shard_id"]


TERMINAL_FIELDS = ("status", "failure", "exit_code", "started_on", "finished_on", "log_tail", "host_id", "job_id")


def check_invariants(case: Case, acting: Shard, before: Any, after: Any, acks: list[dict[str, Any]]) -> None:
    """The rules a 200 keeps, whatever the body said."""
    updates = case.body["updates"]
    assert [a.get("seq") for a in acks] == [u["seq"] for u in updates], "one ack per update, in order"
    for ack in acks:
        assert ack["result"] in ("accepted", "rejected"), ack
        if ack["result"] == "rejected":
            assert isinstance(ack.get("error"), str) and ack["error"], ack
    replaced = before["shard"][acting.id]["instance"] not in ("", after["shard"][acting.id]["instance"])
    last_accepted: dict[int, str] = {}
    for update, ack in zip(updates, acks, strict=True):
        hqe = before["hqe"].get(update["hqe"]) if isinstance(update["hqe"], int) else None
        if hqe is None or _job_shard(hqe["job_id"], before) != acting.id:
            assert ack["result"] == "rejected", ("an unknown or foreign HQE was accepted", update, ack)
            continue
        if ack["result"] == "accepted":
            last_accepted[update["hqe"]] = update["status"]
    for hqe_id, old in before["hqe"].items():
        new = after["hqe"][hqe_id]
        if _job_shard(old["job_id"], before) != acting.id:
            assert new == old, ("another shard's HQE changed", old, new)
            continue
        if old["status"] in HQEStatus.TERMINAL:
            assert [new[k] for k in TERMINAL_FIELDS] == [old[k] for k in TERMINAL_FIELDS], (
                "a terminal HQE changed",
                old,
                new,
            )
        if new["status"] != old["status"]:
            expected = {last_accepted.get(hqe_id)}
            if replaced and old["status"] in (HQEStatus.STARTING, HQEStatus.RUNNING):
                expected.add(HQEStatus.FAILED)
            assert new["status"] in expected, ("an HQE changed without an accepted update saying so", old, new)
    for host_id, old in before["host"].items():
        if old["shard_id"] != acting.id:
            assert after["host"][host_id] == old, ("another shard's host changed", old, after["host"][host_id])
    for job_id, old in before["job"].items():
        if old["shard_id"] != acting.id:
            assert after["job"][job_id] == old, ("another shard's job changed", old, after["job"][job_id])
    for shard_id, old in before["shard"].items():
        if shard_id != acting.id:
            assert after["shard"][shard_id] == old, ("another shard's row changed", old)


def check_answer(case: Case, acting: Shard, after: Any, payload: dict[str, Any]) -> None:
    """A 200 tells a shard only about its own hosts and jobs, and removes only hosts it said it knew."""
    for host in payload["hosts"]:
        assert after["host"][host["id"]]["shard_id"] == acting.id, ("another shard's host was sent", host["id"])
    for job in payload["jobs"]:
        assert after["job"][job["id"]]["shard_id"] == acting.id, ("another shard's job was sent", job["id"])
    known = {h["id"] for h in case.body["known_hosts"]}
    for host_id in payload["removed_host_ids"]:
        assert host_id in known, ("a host the shard did not know was removed", host_id)
        row = after["host"].get(host_id)
        assert row is None or row["shard_id"] != acting.id, ("one of the shard's own hosts was removed", host_id)


def run_case(client: Client, world: World, case: Case) -> None:
    """Posts one case and checks its answer; raises AssertionError (or what the server raised) on a defect."""
    if case.silent:
        silence = timedelta(days=1)
        Shard.objects.update(last_heartbeat=datetime.now(UTC) - silence)
    before, checksum = _rows(), database_checksum()
    headers = {"HTTP_AUTHORIZATION": f"{case.scheme} {case.token}"} if case.token else {}
    resp = client.post("/api/v1/heartbeat", data=case.raw, content_type="application/json", **headers)
    tally.HEARTBEAT.statuses[resp.status_code] += 1
    assert resp.status_code in ALLOWED, (resp.status_code, resp.content[:500])
    payload = resp.json()
    if resp.status_code != 200:
        assert isinstance(payload.get("error"), str) and payload["error"], payload
        assert payload.get("detail") is None or isinstance(payload["detail"], dict), payload
        assert database_checksum() == checksum, f"a {resp.status_code} changed the database: {payload}"
        if case.token is None or case.scheme.lower() != "bearer":
            assert resp.status_code in (401, 413), payload
        return
    acting = Shard.objects.get(hostname=case.body["shard"])
    assert world.tokens[acting.hostname] == case.token, "a 200 for a token of another shard"
    after = _rows()
    check_invariants(case, acting, before, after, payload["acks"])
    check_answer(case, acting, after, payload)
    # A lost response: the shard sends the same request again, and nothing applies twice.
    again = client.post("/api/v1/heartbeat", data=case.raw, content_type="application/json", **headers)
    assert_status(again, 200)
    replayed = _rows()
    for kind in ("hqe", "host", "job"):
        assert replayed[kind] == after[kind], f"the same request applied again changed a {kind}"
    tally.HEARTBEAT.accepted_updates += sum(a["result"] == "accepted" for a in payload["acks"])


# `make test`'s 200 generated bodies (300 until 2026-11-26), each sent twice: 300 took 240 s alone
# at a load of 12 on two cores, and past 300 s with CI's two runs side by side at that load.
@pytest.mark.timeout(900)
def test_any_heartbeat_body_is_answered_soundly_and_keeps_the_invariants(fleet: Fleet, heartbeat: Heartbeat) -> None:
    """The contract of docs/protocol.md, checked over generated whole bodies (counted in tally.HEARTBEAT)."""
    world = build_world(fleet, heartbeat)
    client = Client(raise_request_exception=True)
    counts = tally.HEARTBEAT

    @settings(
        max_examples=tally.HEARTBEAT_CASES,
        deadline=None,
        derandomize=tally.DERANDOMIZE,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases(world))
    def check(case: Case) -> None:
        counts.cases += 1
        try:
            with transaction.atomic():
                try:
                    run_case(client, world, case)
                finally:
                    transaction.set_rollback(True)
        except Exception as exc:  # every defect is counted and shown, none stops the run
            counts.fail(f"{type(exc).__name__}: {str(exc)[:1500]}\n{case.show()}\n{traceback.format_exc()[-1500:]}")

    check()
    assert counts.failed == 0, f"{counts.failed} of {counts.cases} heartbeat cases failed:\n\n{counts.report()}"
