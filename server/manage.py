"""`fleetshard-manage`: Django's manage.py for an installed fleetshard (no checkout needed).

FLEETSHARD_ROLE=master|shard picks the role, as with the checkout's manage.py, which calls this too.
"""

import os
import sys

# Commands of one role only: the other role does not install their app, and Django would say
# "Unknown command".
ROLE_COMMANDS = {
    "create_token": "master",
    "build_trace_days": "master",
    "detect_regressions": "master",
    "run_shard": "shard",
    "run_worker_manager": "shard",
}


def main() -> None:
    """A wrong role or a database not migrated ends in one line saying what to do, not a traceback."""
    from common.constants import ROLES

    role = os.environ.get("FLEETSHARD_ROLE", ROLES[0])
    if role not in ROLES:
        sys.exit(f"FLEETSHARD_ROLE={role!r} is not a role: use {' or '.join(ROLES)} (the default is {ROLES[0]})")
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    needs = ROLE_COMMANDS.get(command)
    if (
        needs is not None
        and needs != role
        and os.environ.get("DJANGO_SETTINGS_MODULE", "server.settings") == ("server.settings")
    ):
        sys.exit(f"{command} is a {needs} command: run it with FLEETSHARD_ROLE={needs} (not {role})")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "server.settings")
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    if os.environ.get("FLEETSHARD_LOG_FORMAT", "").strip().lower() == "json" and not sys.stderr.isatty():
        from common.logjson import JsonStderr

        # A command's error (`CommandError: ...`, printed by Django) is a JSON line like the rest; an
        # operator at a terminal (the env file sourced by hand) still reads prompts and errors plainly.
        sys.stderr = JsonStderr(sys.stderr)

    try:
        execute_from_command_line(sys.argv)
    except DatabaseError as exc:
        # Django's own commands (createsuperuser, shell, ...) do not check; ours do (common/schema.py).
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        missing = "no such table" in first or ("relation" in first and "does not exist" in first)
        hint = (
            f"the {role}'s database is not migrated: run `FLEETSHARD_ROLE={role} python manage.py migrate`"
            if missing
            else "check DATABASE_URL and that the database is up"
        )
        sys.exit(f"database error: {first}. {hint}")


if __name__ == "__main__":
    main()
