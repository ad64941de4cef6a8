"""Gives a user a password for the admin's login page: a token opens the API, not the admin."""

import getpass
import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.errors import FleetshardError
from common.schema import check_migrated
from master.services import set_password

PASSWORD_ENV = "FLEETSHARD_PASSWORD"


class Command(BaseCommand):
    help = (
        "Set USERNAME's password for the admin (/admin/). It is read from FLEETSHARD_PASSWORD, else asked "
        "twice on a terminal, else read as the first line of standard input."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.ROLE != "master":
            raise CommandError("set_password needs FLEETSHARD_ROLE=master")
        check_migrated()
        username = options["username"]
        password = self.read_password()
        try:
            set_password(username, password, acting_user=None)
        except FleetshardError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Password set for {username}: log in to the admin (/admin/) with it.")

    @staticmethod
    def read_password() -> str:
        if os.environ.get(PASSWORD_ENV):
            return os.environ[PASSWORD_ENV]
        if sys.stdin.isatty():
            first = getpass.getpass("Password: ")
            if getpass.getpass("Password (again): ") != first:
                raise CommandError("the passwords differ: nothing changed")
            return first
        return sys.stdin.readline().rstrip("\r\n")
