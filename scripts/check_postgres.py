"""Exits non-zero, naming the address, when the PostgreSQL in DATABASE_URL (or argv[1]) is unreachable.

CI runs this before the suite so an unreachable database fails loudly instead of skipping work.
"""

import os
import sys

import dj_database_url
import psycopg2


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        print(f"not a PostgreSQL URL: {url!r}", file=sys.stderr)
        return 2
    db = dj_database_url.parse(url)
    try:
        psycopg2.connect(
            host=db["HOST"],
            port=db["PORT"] or 5432,
            user=db["USER"],
            password=db["PASSWORD"],
            dbname="postgres",
            connect_timeout=5,
        ).close()
    except psycopg2.OperationalError as exc:
        print(f"PostgreSQL is unreachable at {db['HOST']}:{db['PORT'] or 5432}: {exc}".strip(), file=sys.stderr)
        return 1
    print(f"PostgreSQL reachable at {db['HOST']}:{db['PORT'] or 5432}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
