"""Generated requests against a live server: whatever they send, never a 5xx, and every answer as documented.

The requests come from docs/openapi.yaml, which test_schema asserts is the schema the server serves
(schemathesis' lazy fixture loader does not work with this pytest). Bounded, a few examples per
operation, so the suite stays fast on a small machine.
"""

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from master import services
from tests.master.api.conftest import SCHEMA_PATH

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff_token(fleet: Any) -> str:
    return services.create_personal_token("fuzzer", admin=True, acting_user=None)[1]


schema = schemathesis.openapi.from_path(SCHEMA_PATH)


@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_request_makes_the_server_fail(case: Any, live_server: Any, staff_token: str) -> None:
    response = case.call(base_url=live_server.url, headers={"Authorization": f"Bearer {staff_token}"}, timeout=30)
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance, content_type_conformance])
