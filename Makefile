# The README's two commands: `make demo` runs the whole system here; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv test lint fuzz demo chaos screenshots clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

# Runs on SQLite by default; set DATABASE_URL=postgres://... to run on PostgreSQL.
test: venv
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

# Long, randomised fuzzing (README, "Tests"): FUZZ_CASES whole heartbeat bodies against the real endpoint
# and FUZZ_REST_CASES generated requests per REST operation (plus schemathesis' coverage phase, linked
# sequences and the CLI's bodies). Prints the cases run and the failures of each suite. `make test`
# runs the same suites short and derandomised.
FUZZ_CASES ?= 2000
FUZZ_REST_CASES ?= 100
fuzz: venv
	FLEETSHARD_FUZZ_CASES=$(FUZZ_CASES) FLEETSHARD_FUZZ_REST_CASES=$(FUZZ_REST_CASES) FLEETSHARD_FUZZ_RANDOM=1 \
		$(PY) -m pytest tests/fuzz --timeout=3600 -q -p no:cacheprovider $(PYTEST_ARGS)

# Type checks: [tool.mypy] in pyproject.toml (strict on common, shard and the heartbeat endpoint).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Refreshes the README's admin pictures in docs/ from the browser tests.
screenshots: venv
	FLEETSHARD_SCREENSHOTS_DIR=$(CURDIR)/docs $(PY) -m pytest tests/browser

demo: venv
	$(PY) scripts/demo.py

# The chaos run (bench/chaos.py): 2,000 jobs through master, shard, database and network faults, on
# PostgreSQL. CHAOS_ARGS="--jobs 200 --faults 1 --seed 7" scales it down or repeats a run.
CHAOS_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
CHAOS_ARGS ?=
chaos: venv
	DATABASE_URL=$(CHAOS_DATABASE_URL) $(PY) bench/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) var
