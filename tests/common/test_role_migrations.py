"""Each role's own models (Token on the master; outbox, dead letters, shard state on the shard) moved
out of common, and so did the scheduler's bookkeeping columns (into shard's HostState and Run). A
database of the old layout (common 0003) must migrate forward keeping every row and value, and the
other role's leftover tables must go only when empty."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.support import Role, drop_database, fresh_database_url

# Today's layout: every model in common, and the master's audit trail.
OLD = [("common", "0003_shard_instances"), ("master", "0001_audit")]
# Django's own apps as they are now, which the moved models' content types and permissions live in.
STOCK = [("contenttypes", "0002_remove_content_type_name"), ("auth", "0012_alter_user_first_name_max_length")]
# Where each moved model lives now.
OWNER = {"token": "master", "outboxentry": "shard", "deadletter": "shard", "shardstate": "shard"}
WHEN = datetime(2026, 11, 1, 12, 30, tzinfo=UTC)
# The bookkeeping that moved from common's columns to shard's tables, as (id, *fields) rows.
HOST_FIELDS = ("runner", "repair_failed_version", "retired")
RUN_FIELDS = ("runner", "pid", "results_dir")
HELD_BY = "lab1:4242:777"
# What a shard mid-run had in those columns, as shard's HostState and Run must hold it after the move:
# every host gets a state, and every HQE a scheduler took (running, ended, or left Starting) its run.
BOOKKEEPING = {
    "hosts": [
        [1, HELD_BY, None, False],
        [2, "", 3, False],
        [3, "", None, True],
        [4, HELD_BY, None, True],
        [5, "", None, False],
    ],
    "runs": [
        [10, HELD_BY, 31337, "/var/lib/fleetshard/results/7/10-h1"],
        [11, "lab1:999:1", 4000, "/var/lib/fleetshard/results/7/11-h4"],
        [12, HELD_BY, None, ""],
    ],
}


def seed_bookkeeping(apps: Any) -> None:
    """Hosts held, failed and retired, and HQEs running, ended, starting and queued, in the old columns."""
    common = {name: apps.get_model("common", name).objects for name in ("Host", "Job", "HostQueueEntry")}
    statuses = ["Running", "Repair Failed", "Ready", "Cleaning", "Ready"]
    for (host_id, runner, failed, retired), status in zip(BOOKKEEPING["hosts"], statuses, strict=True):
        common["Host"].create(
            id=host_id,
            hostname=f"h{host_id}",
            status=status,
            version=4,
            runner=runner,
            repair_failed_version=failed,
            retired=retired,
        )
    job = common["Job"].create(id=7, name="flash", owner="ana", command="./run")
    for (hqe_id, runner, pid, results_dir), status in zip(
        BOOKKEEPING["runs"], ["Running", "Completed", "Starting"], strict=True
    ):
        common["HostQueueEntry"].create(
            id=hqe_id, job=job, host_id=hqe_id - 9, status=status, runner=runner, pid=pid, results_dir=results_dir
        )
    common["HostQueueEntry"].create(id=13, job=job)  # queued: no run yet


def bookkeeping(get_model: Any, *, moved: bool) -> dict[str, list[list[Any]]]:
    """The bookkeeping as it stands, from shard's tables (moved) or common's columns (the old layout)."""
    if moved:
        hosts = get_model("shard", "HostState").objects.order_by("host_id").values_list("host_id", *HOST_FIELDS)
        runs = get_model("shard", "Run").objects.order_by("hqe_id").values_list("hqe_id", *RUN_FIELDS)
    else:
        hosts = get_model("common", "Host").objects.order_by("id").values_list("id", *HOST_FIELDS)
        hqes = get_model("common", "HostQueueEntry").objects.order_by("id")
        runs = hqes.exclude(runner="", pid__isnull=True, results_dir="").values_list("id", *RUN_FIELDS)
    return {"hosts": [list(row) for row in hosts], "runs": [list(row) for row in runs]}


def columns(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


def seed(apps: Any, models: list[str]) -> None:
    """Rows in the moved tables, written through the old common models, and each model's old content type
    with a permission granted on it (as a database made before the move has them)."""
    content_types = apps.get_model("contenttypes", "ContentType").objects
    user = apps.get_model("auth", "User").objects.create(username="ana")
    for model in models:
        content_types.filter(app_label=OWNER[model], model=model).delete()
        old, _ = content_types.get_or_create(app_label="common", model=model)
        permission, _ = apps.get_model("auth", "Permission").objects.get_or_create(
            content_type=old, codename=f"view_{model}", defaults={"name": f"Can view {model}"}
        )
        user.user_permissions.add(permission)
    common = {model: apps.get_model("common", model).objects for model in models}
    if "token" in models:
        shard = apps.get_model("common", "Shard").objects.create(hostname="lab1")
        common["token"].create(digest="d" * 64, prefix="fs_aaaaaaa", user=user, description="ci", created_on=WHEN)
        common["token"].create(digest="e" * 64, prefix="fs_bbbbbbb", shard=shard, last_used=WHEN)
    for seq in (7, 8, 9) if "outboxentry" in models else ():
        common["outboxentry"].create(seq=seq, hqe_id=100 + seq, job_id=10, payload={"status": "Running"})
    if "deadletter" in models:
        common["deadletter"].create(seq=6, hqe_id=106, job_id=11, payload={"s": 1}, error="not assigned")
    if "shardstate" in models:
        common["shardstate"].create(last_seq=9, last_heartbeat_ok=WHEN, instance="i" * 36, identity="file:x")


def snapshot(get_model: Any, models: list[str], app_of: Any) -> dict[str, Any]:
    """Every row of the moved models, and the ids of their content types and granted permissions."""
    content_types = get_model("contenttypes", "ContentType").objects
    rows = {m: list(get_model(app_of(m), m).objects.order_by("id").values()) for m in models}
    granted = get_model("auth", "Permission").objects.filter(user__username="ana")
    rows["content types"] = {m: content_types.get(app_label=app_of(m), model=m).id for m in models}
    rows["granted"] = sorted(granted.values_list("id", "content_type__app_label", "codename"))
    return json.loads(json.dumps(rows, default=str))


def only_moved_columns(after: dict[str, Any], before: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """`after` without the columns later migrations added (with their defaults): not part of the move."""
    for m in models:
        if before[m]:
            after[m] = [{k: row[k] for k in before[m][0]} for row in after[m]]
    return after


def migrate(targets: list[tuple[str, str | None]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader


def tables() -> set[str]:
    return set(connection.introspection.table_names())


@pytest.fixture
def old_database(transactional_db: None) -> Iterator[Any]:
    """The test database taken back to today's layout; forward to the latest again afterwards."""
    loader = migrate([*OLD, ("shard", None)])
    yield loader
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_both_roles_models_move_with_every_row(old_database):
    models = list(OWNER)
    seed(old_database.project_state(OLD + STOCK).apps, models)
    before = snapshot(old_database.project_state(OLD + STOCK).apps.get_model, models, lambda m: "common")
    assert {"common_token", "common_outboxentry"} <= tables()

    loader = migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    after = only_moved_columns(snapshot(loader.project_state().apps.get_model, models, OWNER.get), before, models)
    granted = [[pk, OWNER[codename.removeprefix("view_")], codename] for pk, _, codename in before.pop("granted")]
    assert after.pop("granted") == granted
    assert after == before and len(after["outboxentry"]) == 3 and len(after["token"]) == 2
    assert {"master_token", "shard_outboxentry", "shard_deadletter", "shard_shardstate"} <= tables()
    assert not {"common_token", "common_outboxentry", "common_deadletter", "common_shardstate"} & tables()


def test_the_move_is_reversible(old_database):
    seed(old_database.project_state(OLD + STOCK).apps, ["outboxentry", "deadletter", "shardstate"])
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    loader = migrate([*OLD, ("shard", None)])
    outbox = loader.project_state(OLD + STOCK).apps.get_model("common", "OutboxEntry").objects
    assert list(outbox.values_list("seq", flat=True)) == [7, 8, 9]
    assert "shard_outboxentry" not in tables()


def test_run_records_and_host_claims_survive_the_upgrade_and_back(old_database, monkeypatch):
    """Copied two rows at a time here, so the batches' seams are crossed: no row lost or copied twice."""
    monkeypatch.setattr(import_module("shard.migrations.0002_host_states_and_runs"), "BATCH", 2)
    seed_bookkeeping(old_database.project_state(OLD + STOCK).apps)
    assert bookkeeping(old_database.project_state(OLD + STOCK).apps.get_model, moved=False) == BOOKKEEPING

    loader = migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    assert bookkeeping(loader.project_state().apps.get_model, moved=True) == BOOKKEEPING
    assert not {"runner", "repair_failed_version", "retired"} & columns("common_host")
    assert not {"runner", "pid", "results_dir"} & columns("common_hostqueueentry")

    loader = migrate([*OLD, ("shard", None)])
    assert bookkeeping(loader.project_state(OLD + STOCK).apps.get_model, moved=False) == BOOKKEEPING
    assert not {"shard_hoststate", "shard_run"} & tables()


def test_makemigrations_finds_nothing_to_do(db):
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


SEED = """
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from tests.common.test_role_migrations import OLD, STOCK, bookkeeping, seed, seed_bookkeeping, snapshot
nodes = [n for n in OLD + STOCK if n[0] != {other!r}]
apps = MigrationLoader(connection).project_state(nodes).apps
seed(apps, {models!r})
result = snapshot(apps.get_model, {models!r}, lambda m: "common")
if {other!r} == "master":
    seed_bookkeeping(apps)
    result["bookkeeping"] = bookkeeping(apps.get_model, moved=False)
"""

BACK = """
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from tests.common.test_role_migrations import OLD, STOCK, bookkeeping, snapshot
nodes = [n for n in OLD + STOCK if n[0] != {other!r}]
get_model = MigrationLoader(connection).project_state(nodes).apps.get_model
result = snapshot(get_model, {models!r}, lambda m: "common")
if {other!r} == "master":
    result["bookkeeping"] = bookkeeping(get_model, moved=False)
"""

READ = """
from django.apps import apps
from django.db import connection
from tests.common.test_role_migrations import OWNER, bookkeeping, columns, snapshot
result = [snapshot(apps.get_model, {models!r}, OWNER.get), sorted(connection.introspection.table_names())]
if apps.is_installed("shard"):
    result[0]["bookkeeping"] = bookkeeping(apps.get_model, moved=True)
result.append(sorted(columns("common_host") | columns("common_hostqueueentry")))
"""


@pytest.fixture
def database(tmp_path: Path) -> Iterator[str]:
    url = fresh_database_url(tmp_path, "roles")
    yield url
    drop_database(url)


@pytest.mark.parametrize("role", ["master", "shard"])
def test_makemigrations_finds_nothing_to_do_in_either_role(role, tmp_path):
    out = Role(role, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path).manage("makemigrations", "--check", "--dry-run")
    assert "No changes detected" in out.stdout


@pytest.mark.parametrize(
    "role, models, gone",
    [
        ("master", ["token"], ["common_outboxentry", "common_deadletter", "common_shardstate"]),
        ("shard", ["outboxentry", "deadletter", "shardstate"], ["common_token"]),
    ],
)
def test_an_old_database_of_one_role_migrates_forward_with_its_rows(role, models, gone, database, tmp_path):
    """A real process of the role, on a database left at the old layout, as an upgrade would find it; a
    shard's database mid-run, with hosts held and HQEs running (the master never had that bookkeeping)."""
    one, other = Role(role, database, tmp_path), "shard" if role == "master" else "master"
    one.manage("migrate", "auth")
    one.manage("migrate", "common", "0003_shard_instances")
    if role == "master":
        one.manage("migrate", "master", "0001_audit")
    before = one.shell(SEED.format(other=other, models=models))

    one.manage("migrate")

    after, names, common_columns = one.shell(READ.format(models=models))
    after = only_moved_columns(after, before, models)
    old_granted = before.pop("granted")
    assert after.pop("granted") == [[pk, role, codename] for pk, _, codename in old_granted]
    assert after == before
    assert after.get("bookkeeping") == (BOOKKEEPING if role == "shard" else None)
    assert not {"runner", "pid", "results_dir", "retired", "repair_failed_version"} & set(common_columns)
    assert ({"shard_hoststate", "shard_run"} <= set(names)) == (role == "shard")
    assert {f"{role}_{m}" for m in models} <= set(names)
    assert not set(gone) & set(names), "the other role's empty tables are dropped"
    assert not {f"common_{m}" for m in models} & set(names)

    one.manage("migrate", role, "0001_audit" if role == "master" else "zero")  # back, common's 0004 first
    back = one.shell(BACK.format(other=other, models=models))
    assert back.pop("granted") == old_granted and back == before, "and back again, rows and all"
    tables_back = one.shell("from django.db import connection\nresult = connection.introspection.table_names()")
    assert {f"common_{m}" for m in OWNER} <= set(tables_back), "the other role's tables are back, empty"


def test_the_other_roles_table_is_kept_when_it_holds_rows(database, tmp_path):
    """Nothing this role uses, but rows nobody accounted for: kept rather than lost, and reported."""
    master = Role("master", database, tmp_path)
    master.manage("migrate", "auth")
    master.manage("migrate", "common", "0003_shard_instances")
    master.shell(SEED.format(other="shard", models=["deadletter"]))

    out = master.manage("migrate")

    assert "kept common_deadletter: this role does not use it, but it holds 1 rows" in out.stderr
    names = master.shell("from django.db import connection\nresult = connection.introspection.table_names()")
    assert "common_deadletter" in names and "common_outboxentry" not in names
