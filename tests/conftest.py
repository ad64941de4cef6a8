"""Fixtures shared by every test. Worlds are built through the master's own services."""

import atexit
import json
import os
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from _pytest.pathlib import LOCK_TIMEOUT, make_numbered_dir_with_cleanup
from django.db import connection
from django.test import Client

from common.constants import PROTOCOL_VERSION
from common.models import Shard
from master import services
from tests.support import assert_status

pytest_plugins = ["tests.support"]


def pytest_configure(config: pytest.Config) -> None:
    """As root, a session's temporary directories go under a directory of its own, not the shared
    /tmp/pytest-of-root that every other root session (the other database's CI run, another
    checkout's) makes 0700 again when it starts. Jobs run as the job user then, and pass through
    every directory above their shard's data dir: a session starting during a run left the job
    unable to open its own inputs ("Permission denied", not the test's fault). Sessions are kept
    and cleaned up as pytest keeps its own (the newest 3 whose sessions ended); a temp root or
    --basetemp given explicitly is left alone."""
    if os.geteuid() != 0 or config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return
    root = Path(tempfile.gettempdir()) / "fsp-root"  # short: Unix sockets live under tmp_path
    root.mkdir(mode=0o700, exist_ok=True)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise pytest.UsageError(f"{root} is not a directory of root's: remove it")
    own = make_numbered_dir_with_cleanup(
        root=root, prefix="s", mode=0o700, keep=3, lock_timeout=LOCK_TIMEOUT, register=atexit.register
    )
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(own)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    for item in items:
        marker = item.get_closest_marker("postgres_only")
        if marker is not None:
            why = marker.kwargs.get("reason", "needs PostgreSQL's row locks and concurrent transactions")
            item.add_marker(pytest.mark.skip(reason=f"{why} (SQLite run)"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A report's captured output as UTF-8 that can be sent: pytest-xdist's workers send every report
    (a passing test's captured log too) to the controller, which cannot carry lone surrogates, and the
    hostile file names jobs write are logged with them (os.fsdecode's). Shown as their escapes."""
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8")) for title, text in report.sections
    ]


@pytest.fixture(scope="session", autouse=True)
def own_cgroups() -> Any:
    """The session's runs live under its own cgroup (server/settings/test.py); what is left there at
    the end is killed and the cgroups removed, so sessions neither reap each other nor leave litter."""
    yield
    from django.conf import settings

    from shard.run.tracking import MECHANISMS, detect, remove_cgroup

    for mechanism in MECHANISMS[1:-1]:
        tracker = detect(mechanism, settings.FLEETSHARD_CGROUP_NAME)
        if tracker.root is not None and tracker.kind == mechanism:
            for runner in tracker.runners():
                tracker.kill_runner(runner)
            remove_cgroup(tracker.root)


class Fleet:
    """Two shards, each owning one board label, with hosts; the default world of master tests."""

    def __init__(self) -> None:
        services.create_labels(["board:a", "board:b", "board:c", "wifi", "pool:x"], acting_user=None)
        self.lab1, self.token1 = services.create_shard("lab1", ["board:a"], acting_user=None)
        self.lab2, self.token2 = services.create_shard("lab2", ["board:b"], acting_user=None)
        services.create_hosts(["a1", "a2"], labels=["board:a", "wifi"], acting_user=None)
        services.create_hosts(["a3"], labels=["board:a"], acting_user=None)
        services.create_hosts(["b1"], labels=["board:b", "wifi"], acting_user=None)
        services.create_hosts(["c1"], labels=["board:c"], acting_user=None)

    def job(self, name: str = "smoke", **kwargs: Any) -> Any:
        kwargs.setdefault("meta_hosts", [("board:a", 1)])
        return services.create_job(
            services.JobRequest(name=name, owner="ana", command="true", **kwargs), acting_user=None
        )


@pytest.fixture
def fleet(db: None) -> Fleet:
    return Fleet()


@pytest.fixture
def fleet_committed(transactional_db: None) -> Fleet:
    """The default world, committed: for what happens once a change commits (notifications)."""
    return Fleet()


class Heartbeat:
    """Posts heartbeats to the master's endpoint the way a shard client would."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @staticmethod
    def instance_of(shard: Shard | str) -> str:
        """The instance id a shard's one database sends unless a test says otherwise."""
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, shard if isinstance(shard, str) else shard.hostname))

    def body(self, shard: Shard | str, **kwargs: Any) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "shard": shard if isinstance(shard, str) else shard.hostname,
            "instance": kwargs.pop("instance", self.instance_of(shard)),
            "client_version": "test",
            "known_hosts": kwargs.pop("known_hosts", []),
            "known_jobs": kwargs.pop("known_jobs", []),
            "updates": kwargs.pop("updates", []),
            **kwargs,
        }

    def post_raw(self, data: bytes | str, token: str | None) -> Any:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
        return self.client.post("/api/v1/heartbeat", data=data, content_type="application/json", **headers)

    def __call__(self, shard: Shard, token: str, expect: int = 200, **kwargs: Any) -> dict[str, Any]:
        resp = self.post_raw(json.dumps(self.body(shard, **kwargs)), token)
        assert_status(resp, expect)
        return resp.json()


@pytest.fixture
def heartbeat(client: Client) -> Heartbeat:
    return Heartbeat(client)


@pytest.fixture
def db_vendor() -> str:
    return connection.vendor


@pytest.fixture(scope="session")
def news_listener(django_db_setup: None, django_db_blocker: Any) -> Any:
    """This process's change listener, stopped before the test database is dropped."""
    from master.sync.notifier import news_board, stop_listener

    with django_db_blocker.unblock():
        board = news_board()
        yield board
        stop_listener()
