"""CI's guard: the suite must fail, not skip, when PostgreSQL is unreachable."""

import subprocess
import sys

import pytest

from tests.support import ROOT, free_port


def check(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/check_postgres.py", url], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_unreachable_postgres_fails_with_the_address():
    port = free_port()
    result = check(f"postgres://postgres@127.0.0.1:{port}/fleetshard")
    assert result.returncode == 1
    assert f"PostgreSQL is unreachable at 127.0.0.1:{port}" in result.stderr


@pytest.mark.postgres_only(reason="checks the PostgreSQL that this run uses")
def test_reachable_postgres_passes():
    result = check("postgres://postgres@127.0.0.1:5432/fleetshard")
    assert result.returncode == 0, result.stderr


def test_ci_script_runs_the_readme_test_command_on_both_databases():
    script = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme
    assert 'DATABASE_URL="$PG_URL" make test' in script and "env -u DATABASE_URL make test" in script
    assert "scripts/check_postgres.py" in script


def test_ci_script_runs_the_linters_and_type_checks_first():
    script = (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make lint" in script
    assert script.index("make lint") < script.index("make test")
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "ruff check" in lint and "ruff format --check" in lint and "mypy" in lint
