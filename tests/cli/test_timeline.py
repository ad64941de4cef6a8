"""`fleetshard timeline export` and `timeline stats` against a live server."""

import gzip
import json

import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

from common.models import Host
from tests.cli.conftest import fails, ok
from tests.master.timeline.factories import add_run, add_state, at
from tests.master.timeline.validate import validate

pytestmark = pytest.mark.django_db(transaction=True)

SINCE = ("--since", "2026-11-23T00:00:00Z", "--until", "2026-11-23T01:00:00Z")


@pytest.fixture
def hour(fleet):
    Host.objects.update(created_on=at(-86400))  # made now, their history is older: they existed then
    add_run("a1", 0, 600, created=0, name="ok")
    add_state("a1", "Repairing", 600, 900)
    return add_run("b1", 100, 200, created=40, name="other")


def test_export_writes_the_trace_plain_or_gzipped(cli, hour, tmp_path):
    plain = tmp_path / "fleet.json"
    out = ok(cli("timeline", "export", "-o", str(plain), *SINCE))
    assert out.stdout.startswith(f"wrote {plain} (")
    trace = json.loads(plain.read_text())
    assert validate(trace).slices == 3
    packed = tmp_path / "lab2.json.gz"
    ok(cli("timeline", "export", "-o", str(packed), "--shard", "lab2", "--job", str(hour.job_id)))
    only = json.loads(gzip.decompress(packed.read_bytes()))
    assert [e["name"] for e in only["traceEvents"] if e["ph"] == "X"] == ["other"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.json", "lab2.json.gz"]


def test_export_refusals_leave_no_file(cli, hour, tmp_path):
    target = tmp_path / "t.json"
    fails(cli("timeline", "export", "-o", str(target), "--shard", "nowhere"), "unknown shard nowhere")
    fails(cli("timeline", "export", "-o", str(target), "--since", "someday"), "invalid since 'someday'")
    fails(cli("timeline", "export", "-o", str(tmp_path / "no" / "t.json")), "cannot write")
    assert list(tmp_path.iterdir()) == []


def test_stats_as_a_table_and_as_json(cli, hour):
    rows = json.loads(ok(cli("timeline", "stats", "--by", "shard", "--json", *SINCE)).stdout)
    lab1 = next(r for r in rows if r["key"] == "lab1")
    assert (lab1["running_s"], lab1["repairing_s"], lab1["runs"]) == (600.0, 300.0, 1)
    assert set(lab1) >= {"key", "running_s", "cleaning_s", "repairing_s", "idle_s", "utilisation", "runs"}
    table = ok(cli("timeline", "stats", "--label", "wifi", *SINCE)).stdout
    assert "Utilisation" in table and "16.7%" in table  # a1: 600 s of 3600
    fails(cli("timeline", "stats", "--label", "board:zz"), "unknown label")


def test_export_to_pftrace_writes_perfettos_protobuf(cli, hour, tmp_path):
    target = tmp_path / "fleet.pftrace"
    ok(cli("timeline", "export", "-o", str(target), *SINCE))
    names = {p.track_event.name for p in Trace.FromString(target.read_bytes()).packet if p.track_event.name}
    assert names == {"ok", "Repairing", "other"}
