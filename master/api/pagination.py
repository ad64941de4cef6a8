"""Limit/offset pagination with bounds, so an absurd offset is an empty page rather than a 500
(SQLite cannot bind integers over 64 bits; PostgreSQL refuses them in OFFSET)."""

from typing import Any

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_OFFSET = 2**31 - 1


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = 1000

    def get_offset(self, request: Request) -> int:
        return min(super().get_offset(request), MAX_OFFSET)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.limit_query_param:
                param["schema"].update(minimum=1, maximum=self.max_limit)
            elif param["name"] == self.offset_query_param:
                param["schema"].update(minimum=0, maximum=MAX_OFFSET)
        return params
