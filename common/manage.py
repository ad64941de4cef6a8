"""`fleetshard-manage`: Django's manage.py for an installed fleetshard (no checkout needed).

FLEETSHARD_ROLE=master|shard picks the role, as with the checkout's manage.py, which calls this too.
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "common.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
