"""CI's guard: the suite must fail, not skip, when PostgreSQL is unreachable."""

import re
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
    postgres = r'DATABASE_URL="\$PG_URL" FLEETSHARD_DATA_DIR=var/ci-postgres (PYTEST_ARGS="[^"]*" )?make test'
    assert re.search(postgres, script)
    sqlite = r'env -u DATABASE_URL FLEETSHARD_DATA_DIR=var/ci-sqlite (PYTEST_ARGS="[^"]*" \\\n *)?make test'
    assert re.search(sqlite, script)
    assert "scripts/check_postgres.py" in script


def test_ci_script_runs_the_linters_and_type_checks_first():
    script = (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make lint" in script
    assert script.index("make lint") < script.index("make test")
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "ruff check" in lint and "ruff format --check" in lint and "mypy" in lint


def test_ci_script_fails_when_either_databases_run_fails(tmp_path):
    """Both runs go side by side; a failure (or pytest's exit 5, no tests) of either must fail CI, and
    CI's last lines name what failed in either run."""
    script = (ROOT / ".ci" / "run").read_text()
    block = script[script.index("mkdir -p var/ci-postgres") :]
    for pg, sq, expected in [(0, 0, 0), (1, 0, 1), (0, 5, 1), (2, 1, 1)]:
        stub = tmp_path / "bin"
        stub.mkdir(exist_ok=True)
        (stub / "make").write_text(
            "#!/bin/sh\n"
            f'if [ -n "$DATABASE_URL" ]; then echo pg; echo "FAILED test_x::t - pg {pg}"; exit {pg}; fi\n'
            f'echo sqlite; echo "= 3 passed in 1.00s ="; exit {sq}\n'
        )
        (stub / "make").chmod(0o755)
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env={"PATH": f"{stub}:/usr/bin:/bin", "PG_URL": "postgres://x", "DATABASE_URL": "postgres://x"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (result.returncode != 0) == bool(expected), (pg, sq, result.stdout, result.stderr)
        assert "[postgres] pg" in result.stdout and "[sqlite] sqlite" in result.stdout
        tail = result.stdout.split("== what failed, and each run's totals ==\n", 1)[1]
        digest = tail.split("== make test:", 1)[0].splitlines()
        assert f"[postgres] FAILED test_x::t - pg {pg}" in digest and "[sqlite] = 3 passed in 1.00s =" in digest
        assert all(line.startswith(("[postgres] FAILED", "[sqlite] =")) for line in digest), digest


def test_make_demo_builds_a_runtime_venv_without_the_test_extras():
    """`make demo` is for trying fleetshard: pytest, playwright, schemathesis and mypy are half a gigabyte."""
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "demo", "VENV=/nonexistent/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--require-hashes -r requirements-runtime.lock" in dry and "requirements.lock" not in dry
    assert dry.rstrip().endswith("scripts/demo.py")
    tests = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "test", "VENV=/nonexistent/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--require-hashes -r requirements.lock" in tests
