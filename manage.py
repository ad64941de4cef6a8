#!/usr/bin/env python
"""Entry point for both roles; FLEETSHARD_ROLE=master|shard picks which one this process is."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "common.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
