"""The chaos run's own checks and plans (bench/chaos.py), without processes or databases: a check
that cannot see a double run or a leftover process would make every chaos run pass."""

import argparse
import importlib.util
import random
import subprocess
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import ROOT, wait_until


@pytest.fixture(scope="module")
def chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_bench", ROOT / "bench" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shards(chaos: ModuleType, tmp_path: Path) -> list:
    return [
        chaos.ShardSpec(f"c{i}", f"board:c{i}", [f"c{i}-dut{h}" for h in range(4)], None, None, tmp_path / f"c{i}")
        for i in range(1, 4)
    ]


def test_results_directories_count_a_second_run_of_an_hqe(chaos, tmp_path):
    for run in ("7/11-c1-dut1", "7/12-c1-dut2", "7/11-c1-dut1-2", "8/13-c2-dut1"):
        (tmp_path / "r1" / run).mkdir(parents=True)
    (tmp_path / "r2" / "7" / "11-c1-dut3").mkdir(parents=True)
    (tmp_path / "r1" / "7" / "notes.txt").write_text("not a run")
    runs = chaos.results_runs([tmp_path / "r1", tmp_path / "r2", tmp_path / "missing"])
    assert runs == Counter({11: 3, 12: 1, 13: 1})


def test_marker_lines_count_runs(chaos, tmp_path):
    (tmp_path / "runs").write_text("5\n6\n5\n")
    assert chaos.marker_runs(tmp_path) == Counter({5: 2, 6: 1})
    assert chaos.marker_runs(tmp_path / "none") == Counter()


def test_the_job_mix_is_seeded_and_complete(chaos, tmp_path):
    fleet = shards(chaos, tmp_path)
    plans = chaos.plan_jobs(random.Random(3), 500, fleet, tmp_path, "t1")
    again = chaos.plan_jobs(random.Random(3), 500, fleet, tmp_path, "t1")
    assert [p.spec for p in plans] == [p.spec for p in again]
    assert {p.kind for p in plans} == {"pass", "fail", "timeout", "abort", "multi", "named"}
    assert len({p.name for p in plans}) == 500
    hosts = {h for s in fleet for h in s.hosts}
    for plan in plans:
        assert chaos.process_mark("t1") in plan.spec["command"]
        assert f"{tmp_path}/runs" in plan.spec["command"]
        if plan.kind == "multi":
            assert plan.spec["meta_hosts"][0].endswith("*3")
        if plan.kind == "named":
            assert plan.spec["hosts"][0] in hosts and not plan.spec["meta_hosts"]
        if plan.kind == "timeout":
            assert plan.spec["max_runtime_mins"] == 1
        assert (plan.abort_after_s is not None) == (plan.kind == "abort")


@pytest.mark.parametrize(("faults", "total"), [(5, 16), (1, 8), (0, 0)])
def test_faults_scale_down_to_one_of_each_kind(chaos, tmp_path, faults, total):
    run = chaos.Chaos(argparse.Namespace(faults=faults), random.Random(1), tmp_path, "t2", marks=tmp_path)
    plan = run.fault_plan()
    assert len(plan) == total
    assert all(0.03 <= at <= 0.9 for at, _ in plan)
    if faults == 1:
        assert Counter(kind for _, kind in plan) == Counter(dict.fromkeys(chaos.FAULT_COUNTS, 1))


def test_a_leftover_job_process_is_found_by_its_mark(chaos):
    proc = subprocess.Popen(["/bin/sh", "-c", f": {chaos.process_mark('t3')}; sleep 30; exit 0"])
    try:
        # Under load the child may not have exec'd its shell yet: give it a moment.
        found = wait_until(
            lambda: [line for line in chaos.leftover_processes("t3") if f"pid {proc.pid}:" in line],
            timeout=10,
            what="the marked process to show",
        )
        assert found
        assert chaos.leftover_processes("t4") == []
    finally:
        proc.kill()
        proc.wait(10)
