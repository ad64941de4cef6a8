"""OpenAPI details drf-spectacular cannot infer: the Bearer token scheme and the error responses."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema

from master.api.serializers import ErrorSerializer


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "master.access.authentication.PersonalTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token from `manage.py create_token USERNAME`. Shard tokens are refused.",
        }


class ResultsUploadScheme(OpenApiAuthenticationExtension):
    target_class = "master.access.authentication.ResultsUploadAuthentication"
    name = "resultsUploadToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token, or a shard's token (for the results of its own HQEs).",
        }


_ERRORS = {
    "400": "Invalid input; `error` names the offending field.",
    "401": "Missing, unknown or shard token.",
    "403": "Not allowed for this user.",
    "404": "An unknown name or id; `error` names it.",
}
_WRITE_ERRORS = {"409": "Refused by the rules (a label on two shards, a job spanning shards...)."}


class FleetshardAutoSchema(AutoSchema):
    """Documents the JSON error body of every operation, so clients and schema checks can rely on it."""

    # Actions that return several objects (a bulk create, a lock) are neither paginated nor filtered.
    def _is_list_action(self) -> bool:
        return getattr(self.view, "action", None) == "list"

    def get_filter_backends(self) -> list[Any]:
        return super().get_filter_backends() if self._is_list_action() else []

    def _get_paginator(self) -> Any:
        return super()._get_paginator() if self._is_list_action() else None

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        errors = _ERRORS if self.method == "GET" else {**_ERRORS, **_WRITE_ERRORS}
        for code, description in errors.items():
            if code not in responses:
                response = self._get_response_for_code(ErrorSerializer, code, direction=direction)
                response["description"] = description
                responses[code] = response
        return responses
