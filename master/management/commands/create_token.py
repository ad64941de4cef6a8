"""Creates a person's API token (and the user if missing) and prints it once."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.errors import FleetshardError
from common.schema import check_migrated
from master.services import create_personal_token


class Command(BaseCommand):
    help = "Create an API token for USERNAME (creating the user if missing) and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--admin", action="store_true", help="make the user staff and superuser")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "master":
            raise CommandError("create_token needs FLEETSHARD_ROLE=master")
        check_migrated()
        try:
            _, raw = create_personal_token(options["username"], acting_user=None, admin=options["admin"])
        except FleetshardError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(raw)
