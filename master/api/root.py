"""GET /api/v1/: which fleetshard and which heartbeat protocol this master runs.

The version is common.constants.CLIENT_VERSION, the one the package, `fleetshard --version` and a
shard's heartbeat report too. Signed-in callers only, like the rest of the API.
"""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.constants import CLIENT_VERSION, PROTOCOL_VERSION
from master.api.schema import FleetshardAutoSchema


class ApiRootView(APIView):
    schema = FleetshardAutoSchema()

    @extend_schema(
        operation_id="api_root",
        tags=["meta"],
        responses=inline_serializer(
            "ApiRoot",
            {
                "version": serializers.CharField(help_text="The master's fleetshard version."),
                "protocol": serializers.IntegerField(help_text="The heartbeat protocol it speaks."),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        return Response({"version": CLIENT_VERSION, "protocol": PROTOCOL_VERSION})
