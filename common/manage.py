"""`fleetshard-manage`: Django's manage.py for an installed fleetshard (no checkout needed).

FLEETSHARD_ROLE=master|shard picks the role, as with the checkout's manage.py, which calls this too.
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "common.settings")
    from django.core.management import execute_from_command_line

    if os.environ.get("FLEETSHARD_LOG_FORMAT", "").strip().lower() == "json" and not sys.stderr.isatty():
        from common.logjson import JsonStderr

        # A command's error (`CommandError: ...`, printed by Django) is a JSON line like the rest; an
        # operator at a terminal (the env file sourced by hand) still reads prompts and errors plainly.
        sys.stderr = JsonStderr(sys.stderr)

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
