"""The docs stay true to the code: no comment points at a file that is gone, and the figures the docs
quote that a test pins are the pinned ones."""

import re

from tests.master.sync.test_heartbeat import (
    QUERIES_PER_FIRST_HEARTBEAT,
    QUERIES_PER_HEARTBEAT,
    QUERIES_PER_QUIET_HEARTBEAT,
)
from tests.support import ROOT

CODE_DIRS = ("common", "server", "master", "shard", "cli", "tests", "bench", "scripts")
# A repository path as comments and docstrings write it: a top-level directory, then a file with an extension.
PATH = re.compile(
    r"(?<![\w./-])((?:common|server|master|shard|cli|tests|bench|scripts|docs|deploy|fixtures|\.ci)/[\w./{},-]*\w\.(?:py|md|yaml|yml|toml|sh|conf|service|timer|env|json|png|txt|lock))\b"
)


def expand(path: str) -> list[str]:
    """`deploy/systemd/fleetshard-{master,shard}.service` names two files."""
    match = re.search(r"\{([^}]*)\}", path)
    if not match:
        return [path]
    return [p for part in match.group(1).split(",") for p in expand(path[: match.start()] + part + path[match.end() :])]


def referenced_paths() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for top in CODE_DIRS:
        for source in (ROOT / top).rglob("*.py"):
            if "/migrations/" in source.as_posix():
                continue
            for match in PATH.finditer(source.read_text()):
                for path in expand(match.group(1)):
                    found.setdefault(path, set()).add(str(source.relative_to(ROOT)))
    return found


def test_no_code_points_at_a_file_that_does_not_exist():
    missing = {path: sorted(where) for path, where in referenced_paths().items() if not (ROOT / path).exists()}
    assert not missing, "files named in code that do not exist:\n" + "\n".join(
        f"  {path}  (in {', '.join(where)})" for path, where in sorted(missing.items())
    )


def test_the_path_scan_finds_references():
    """The scan above must see real references, or it would pass on nothing."""
    found = referenced_paths()
    assert "docs/protocol.md" in found and "shard/sync/client.py" in found


def test_the_heartbeat_query_counts_in_the_docs_are_the_pinned_ones():
    features = (ROOT / "docs" / "features.md").read_text()
    said = re.search(
        r"fixed: (\d+) queries with 1 or with 500 hosts.*?; (\d+) for a new instance's first", features, re.S
    )
    quiet = re.search(r"(\d+) on PostgreSQL \((\d+) on SQLite\) for one with\s+nothing new", features)
    assert said and quiet, "docs/features.md no longer states the heartbeat's query counts"
    assert (int(said.group(1)), int(said.group(2))) == (QUERIES_PER_HEARTBEAT, QUERIES_PER_FIRST_HEARTBEAT)
    assert {"postgresql": int(quiet.group(1)), "sqlite": int(quiet.group(2))} == QUERIES_PER_QUIET_HEARTBEAT


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
