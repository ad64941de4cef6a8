#!/usr/bin/env python
"""Entry point for both roles; FLEETSHARD_ROLE=master|shard picks which one this process is.
An installed fleetshard has the same as `fleetshard-manage` (server/manage.py)."""

from server.manage import main

if __name__ == "__main__":
    main()
