"""API test clients whose every response is checked against the committed OpenAPI schema."""

from functools import cache
from typing import Any

import pytest
from openapi_core import OpenAPI
from openapi_core.contrib.django import DjangoOpenAPIRequest, DjangoOpenAPIResponse
from rest_framework.test import APIClient

from master import services
from tests.support import ROOT

SCHEMA_PATH = ROOT / "docs" / "openapi.yaml"


@cache
def openapi() -> OpenAPI:
    return OpenAPI.from_file_path(str(SCHEMA_PATH))


class CheckedClient(APIClient):
    """An APIClient that fails the test when a response does not match docs/openapi.yaml."""

    def request(self, **kwargs: Any) -> Any:
        response = super().request(**kwargs)
        # A streamed body (the timeline export) is read by the test itself, once.
        if (
            response.get("Content-Type", "").startswith("application/json")
            and response.wsgi_request.path.startswith("/api/v1/")
            and not response.streaming
        ):
            openapi().validate_response(DjangoOpenAPIRequest(response.wsgi_request), DjangoOpenAPIResponse(response))
        return response


def client_for(token: str | None) -> CheckedClient:
    client = CheckedClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def staff(db: None) -> CheckedClient:
    return client_for(services.create_personal_token("boss", admin=True, acting_user=None)[1])


@pytest.fixture
def user(db: None) -> CheckedClient:
    """A signed-in person who is not staff: "ana", the owner of the fleet fixture's jobs."""
    return client_for(services.create_personal_token("ana", acting_user=None)[1])


@pytest.fixture
def other_user(db: None) -> CheckedClient:
    return client_for(services.create_personal_token("bob", acting_user=None)[1])


@pytest.fixture
def anonymous() -> CheckedClient:
    return client_for(None)
