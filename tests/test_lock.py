"""requirements.lock, which `make venv` and CI install from, holds exactly pyproject.toml's pins, each
with its hashes."""

import re
import tomllib

from tests.support import ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        match = PIN.match(requirement)
        assert match, f"pyproject.toml: {requirement!r} is not pinned with =="
        pins[normalised(match[1])] = match[2]
    return pins


def locked() -> dict[str, tuple[str, int]]:
    """name: (version, how many hashes) for every requirement of the lock file."""
    entries: dict[str, tuple[str, int]] = {}
    name = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = PIN.match(line)
        if match:
            name = normalised(match[1])
            entries[name] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = entries[name]
            entries[name] = (version, hashes + 1)
    return entries


def test_the_lock_holds_every_pin_of_pyproject_at_its_version():
    lock = locked()
    wrong = {
        name: (version, lock.get(name, ("missing", 0))[0])
        for name, version in pyproject_pins().items()
        if lock.get(name, ("missing", 0))[0] != version
    }
    assert not wrong, f"pyproject.toml pin vs requirements.lock (run `make lock`): {wrong}"


def test_every_locked_package_has_a_hash():
    lock = locked()
    assert len(lock) > len(pyproject_pins())
    assert not [name for name, (_, hashes) in lock.items() if hashes == 0]


def test_make_venv_installs_from_the_locks_with_hashes():
    makefile = (ROOT / "Makefile").read_text()
    runtime = makefile.split("\n$(VENV)/.runtime:", 1)[1].split("\n\n", 1)[0]
    assert "requirements-runtime.lock" in runtime.splitlines()[0]
    assert "--require-hashes -r requirements-runtime.lock" in runtime and "--no-deps -e ." in runtime
    recipe = makefile.split("\n$(VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert "$(VENV)/.runtime requirements.lock" in recipe.splitlines()[0]
    assert "--require-hashes -r requirements.lock" in recipe
