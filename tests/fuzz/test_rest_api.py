"""Schemathesis over every operation of the REST API, against a live server and its real database.

Three kinds of requests, all as a superuser (a personal token from master.services), all checked the
same way: never a 5xx, the status documented, the body and content type as docs/openapi.yaml says.
- generated: requests from the committed schema, tally.REST_CASES_PER_OPERATION for each operation;
- stateful: sequences that follow the schema's OpenAPI links (master/api/links.py): create a label,
  host, shard or job, then read it, change it, abort or delete it;
- typical: the bodies the command line sends (`host create -b ... -i ...`, `job create -m
  board:a*2 -p high`), so the ordinary path is covered whatever the generator draws.

Failing cases are counted (tests/fuzz/tally.py), not stopped at; the last test fails if any did.
"""

from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from common.models import Host, Job, Label, Shard
from master import services
from tests.conftest import Fleet
from tests.fuzz import tally
from tests.master.api.conftest import SCHEMA_PATH

pytestmark = pytest.mark.django_db(transaction=True)

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
schema = schemathesis.openapi.from_path(SCHEMA_PATH)
# Schemathesis' coverage phase (boundary and missing-field cases, a few dozen per operation) only in
# the long run: the short one must stay quick.
schema.config.phases.coverage.enabled = tally.REST_CASES_PER_OPERATION >= 50
# Sequences follow the links the schema declares (master/api/links.py) and no guessed ones: the
# guessed ones (a list's hostnames to a delete) made Hypothesis' replays of a sequence inconsistent.
schema.config.phases.stateful.inference.algorithms = []


@pytest.fixture
def superuser_token(fleet: Fleet) -> str:
    """The fleet's two shards, hosts and a job, and a superuser's token to change them all."""
    fleet.job("seed", meta_hosts=[("board:a", 2)])
    return services.create_personal_token("fuzzer", admin=True, acting_user=None)[1]


def reset_fleet() -> None:
    """Back to the fixture's fleet and seed job; the superuser and its token stay."""
    Job.objects.all().delete()
    Host.objects.all().delete()
    Shard.objects.all().delete()
    Label.objects.all().delete()
    Fleet().job("seed", meta_hosts=[("board:a", 2)])


def call_and_check(case: Any, base_url: str, token: str, session: requests.Session | None = None) -> Any:
    """One counted request: its failure (a check, or the server not answering) is recorded, not raised."""
    counts = tally.REST
    counts.cases += 1
    counts.operations.add(case.operation.label)
    try:
        response = case.call(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, session=session, timeout=30
        )
        counts.statuses[response.status_code] += 1
        # Counted here too: schemathesis' pytest plugin may report a 5xx itself, past validate_response.
        assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
        case.validate_response(response, checks=CHECKS)
        return response
    except Exception as exc:  # every defect is counted and shown, none stops the run
        counts.fail(f"{case.operation.label}: {type(exc).__name__}: {str(exc)[:2000]}\n{case.as_curl_command()}")
        return None


FUZZ_SETTINGS = settings(
    max_examples=tally.REST_CASES_PER_OPERATION,
    deadline=None,
    derandomize=tally.DERANDOMIZE,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@schema.parametrize()
@FUZZ_SETTINGS
def test_generated_requests_are_answered_as_documented(case: Any, live_server: Any, superuser_token: str) -> None:
    call_and_check(case, live_server.url, superuser_token)


def test_linked_sequences_are_answered_as_documented(live_server: Any, superuser_token: str) -> None:
    """Create, then read, change, abort or delete what was created, by the schema's links."""
    links = sum(
        len(response.definition.get("links", {}))
        for result in schema.get_all_operations()
        for response in result.ok().responses.iter_successful_responses()
    )
    assert links >= 10, "docs/openapi.yaml lost its links (master/api/links.py)"
    session = requests.Session()

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            """Every sequence starts from the same fleet: Hypothesis replays sequences and needs the
            server to answer them the same way (else FlakyStrategyDefinition)."""
            reset_fleet()

        def call(self, case: Any, **kwargs: Any) -> Any:
            response = call_and_check(case, live_server.url, superuser_token, session)
            if response is None:
                raise AssertionError("recorded in tally.REST")  # ends this sequence; the failure is counted
            return response

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            """Already checked in call()."""

    try:
        Machine.run(
            settings=settings(
                max_examples=max(5, tally.REST_CASES_PER_OPERATION // 2),
                stateful_step_count=6,
                deadline=None,
                derandomize=tally.DERANDOMIZE,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
        )
    except AssertionError as exc:
        if "recorded in tally.REST" not in str(exc):
            raise


# What `fleetshard` sends for its everyday commands (cli/), through the same checks.
# A body may be a function of the ids made so far (`made["job"]`: the last job created).
TYPICAL: list[tuple[str, str, Any]] = [
    ("POST", "/api/v1/labels/", {"names": ["board:x", "pool:fuzz"]}),
    ("POST", "/api/v1/shards/", {"hostname": "lab3.example.com", "labels": ["board:x"]}),
    (
        "POST",
        "/api/v1/hosts/",
        {
            "hostnames": ["x1", "x2"],
            "labels": ["board:x", "pool:fuzz"],
            "attributes": {"serial": "X1", "os": "linux"},
            "locked": False,
            "lock_reason": "",
        },
    ),
    ("POST", "/api/v1/hosts/lock/", {"hostnames": ["x2"], "reason": "flaky usb"}),
    ("POST", "/api/v1/hosts/unlock/", {"hostnames": ["x2"]}),
    ("GET", "/api/v1/hosts/x1/", None),
    (
        "POST",
        "/api/v1/jobs/",
        {
            "name": "smoke",
            "command": "./run.sh",
            "meta_hosts": ["board:x*2"],
            "dependency_labels": ["pool:fuzz"],
            "priority": "high",
            "timeout_mins": 60,
            "max_runtime_mins": 30,
            "keyvals": {"build": "R120"},
        },
    ),
    ("POST", "/api/v1/jobs/", {"name": "on-hosts", "command": "true", "hosts": ["x1"], "priority": 10}),
    ("GET", "/api/v1/jobs/", None),
    ("POST", "/api/v1/labels/board:x/add_hosts/", {"hosts": ["x1"]}),
    ("POST", "/api/v1/shards/lab3.example.com/add_labels/", {"labels": ["pool:x"]}),
    ("POST", "/api/v1/jobs/abort/", lambda made: {"ids": [made["job"]]}),
    ("POST", "/api/v1/shards/lab3.example.com/remove_label/", {"label": "pool:x"}),
    ("DELETE", "/api/v1/shards/lab3.example.com/", None),
    ("GET", "/api/v1/shards/", None),
    (
        "POST",
        "/api/v1/notifications/",
        {"url": "https://hooks.example.org/fleet", "events": ["job.ended", "regression.new"], "label": "board:x"},
    ),
    ("GET", "/api/v1/notifications/", None),
]


def test_the_command_lines_typical_bodies_are_answered_as_documented(live_server: Any, superuser_token: str) -> None:
    """The everyday path succeeds (2xx) and is documented, so the fuzzing's 4xx are not all it covers."""
    statuses, made = [], {}
    for method, path, body in TYPICAL:
        if callable(body):
            body = body(made)
        operation = schema.find_operation_by_path(method, path)
        assert operation is not None, (method, path)
        template = operation.path
        parameters = dict(zip(_names(template), _values(template, path), strict=True))
        case = operation.Case(path_parameters=parameters or None, **({"body": body} if body is not None else {}))
        response = call_and_check(case, live_server.url, superuser_token)
        statuses.append((method, path, response.status_code if response is not None else None))
        if (method, path) == ("POST", "/api/v1/jobs/") and response is not None and response.status_code == 201:
            made["job"] = response.json()["id"]
    assert all(code is not None and code < 300 for *_, code in statuses), str(statuses)


def _names(template: str) -> list[str]:
    return [part[1:-1] for part in template.split("/") if part.startswith("{")]


def _values(template: str, path: str) -> list[str]:
    return [value for part, value in zip(template.split("/"), path.split("/"), strict=True) if part.startswith("{")]


def test_no_rest_case_failed() -> None:
    """Runs last in this module: the recorded failures, if any, fail the suite with their reproductions."""
    assert tally.REST.failed == 0, (
        f"{tally.REST.failed} of {tally.REST.cases} REST cases failed:\n\n{tally.REST.report()}"
    )
