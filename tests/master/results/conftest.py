"""The API's schema-checked clients, for the results endpoints."""

from tests.master.api.conftest import anonymous, other_user, staff, user

__all__ = ["anonymous", "other_user", "staff", "user"]
