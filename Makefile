# The README's two commands: `make demo` runs the whole system here; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv lock test test-fast lint fuzz demo chaos screenshots clean

venv: $(VENV)/.installed

# What running fleetshard needs (the demo's venv): no test tools, a fraction of the size; every
# dependency from a hashed lock file, then fleetshard itself without resolving anything again.
$(VENV)/.runtime: pyproject.toml requirements-runtime.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements-runtime.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# Tests and linters on top: `make test`, `make lint` and `make venv`.
$(VENV)/.installed: $(VENV)/.runtime requirements.lock
	$(PY) -m pip install --quiet --require-hashes -r requirements.lock
	touch $@

# Regenerates requirements.lock from pyproject.toml's pins (after changing one), with uv in a venv of its own.
UV_VERSION ?= 0.13.9
lock:
	test -x var/uv/bin/uv || (python3 -m venv var/uv && var/uv/bin/pip install --quiet uv==$(UV_VERSION))
	head -3 requirements.lock > var/requirements.lock.head
	var/uv/bin/uv pip compile pyproject.toml --extra test --generate-hashes --universal --python-version 3.11 \
		--no-header --quiet -o var/requirements.lock.body
	cat var/requirements.lock.head var/requirements.lock.body > requirements.lock
	var/uv/bin/uv pip compile pyproject.toml --generate-hashes --universal --python-version 3.11 \
		--no-header --quiet -o var/requirements-runtime.lock.body
	cat var/requirements.lock.head var/requirements-runtime.lock.body > requirements-runtime.lock

# Runs on SQLite by default; set DATABASE_URL=postgres://... to run on PostgreSQL.
test: venv
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

# The suite without what starts real processes or runs long (end-to-end, browser, deploy, fuzzing,
# the packaging and README runs); docs/testing.md has its time. `make test` runs everything.
FAST_SKIP := tests/e2e tests/browser tests/deploy tests/fuzz tests/test_packaging.py tests/test_readme.py \
	tests/master/api/test_schemathesis.py
FAST_WORKERS ?= 4
test-fast: venv
	$(PY) -m pytest -q -p no:cacheprovider -n $(FAST_WORKERS) -m "not e2e and not browser" $(FAST_SKIP:%=--ignore=%) $(PYTEST_ARGS)

# Long, randomised fuzzing (docs/testing.md): FUZZ_CASES whole heartbeat bodies against the real endpoint
# and FUZZ_REST_CASES generated requests per REST operation (plus schemathesis' coverage phase, linked
# sequences and the CLI's bodies), and FUZZ_UPLOAD_CASES hostile result files, traces and log chunks
# through a real shard's uploader. Prints the cases run and the failures of each suite. `make test`
# runs the same suites short and derandomised.
FUZZ_CASES ?= 2000
FUZZ_REST_CASES ?= 100
FUZZ_UPLOAD_CASES ?= 300
fuzz: venv
	FLEETSHARD_FUZZ_CASES=$(FUZZ_CASES) FLEETSHARD_FUZZ_REST_CASES=$(FUZZ_REST_CASES) \
		FLEETSHARD_FUZZ_UPLOAD_CASES=$(FUZZ_UPLOAD_CASES) FLEETSHARD_FUZZ_RANDOM=1 \
		$(PY) -m pytest tests/fuzz --timeout=3600 -q -p no:cacheprovider $(PYTEST_ARGS)

# Type checks: [tool.mypy] in pyproject.toml (strict on common, server, master, shard and cli but the REST API and admin).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Refreshes docs/features.md's admin pictures in docs/ from the browser tests.
screenshots: venv
	FLEETSHARD_SCREENSHOTS_DIR=$(CURDIR)/docs $(PY) -m pytest tests/browser

demo: $(VENV)/.runtime
	$(PY) scripts/demo.py

# The chaos run (bench/chaos.py): 2,000 jobs through master, shard, database and network faults, on
# PostgreSQL. CHAOS_ARGS="--jobs 200 --faults 1 --seed 7" scales it down or repeats a run.
CHAOS_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
CHAOS_ARGS ?=
chaos: venv
	DATABASE_URL=$(CHAOS_DATABASE_URL) $(PY) bench/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) var
