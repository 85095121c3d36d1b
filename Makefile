# agentfast: `make run` to try it, `make test` to test it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run test test-fast test-postgres typecheck bench bench-web bench-compare bench-scale install clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# The Python client and LangGraph, for tests/clients (the OpenAI Agents SDK gets a venv of its own there).
	$(BIN)/python -m pip install --quiet -e "clients/python[test]"
	touch $(STAMP)

install: $(STAMP)

# The bench extra (LangGraph, the peer `make bench-compare` measures against), never in the default install.
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	touch $(BENCH_STAMP)

## Start everything on this machine: SQLite, a private Redis, web (8321), worker and beat.
run: $(STAMP)
	$(BIN)/agentfast dev

# pytest-xdist: one test process per core and one more, since many tests spend their time
# waiting on worker processes, daphne or Chromium (on 2 cores: 281 s against 324 s with one a
# core); PYTEST_WORKERS=0 runs in this process. A test file stays on one worker, so its
# module-scoped Chromium starts once.
PYTEST_WORKERS ?= $(shell python3 -c "import os; print((os.cpu_count() or 1) + 1)")
XDIST = -n $(PYTEST_WORKERS) --dist loadfile
# The suite starts hundreds of Python processes (workers, daphne, the CLI, MCP servers). Where
# PYTHONDONTWRITEBYTECODE is set, as in many container images, each of them compiled the
# project's modules again: a tenth of the suite's time on 2 cores (295 s against 265 s). The
# tests keep the bytecode cache (__pycache__/, ignored by git) whatever the shell says.
TEST_ENV = PYTHONDONTWRITEBYTECODE=

## Run the test suite (SQLite by default; set DATABASE_URL=postgres://… for Postgres).
test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

## The suite without the tests that start worker processes or drive Chromium, for quick loops.
test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -m "not integration and not browser" $(XDIST) $(PYTEST_ARGS)

test-postgres: $(STAMP)
	$(TEST_ENV) DATABASE_URL=postgres://postgres@127.0.0.1:5432/test $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

## Type-check agents/ and dashboard/ (mypy with django-stubs; settings in pyproject.toml).
typecheck: $(STAMP)
	$(BIN)/python -m mypy

## Print the engine's pause/resume latencies and storage per paused run.
bench: $(STAMP)
	$(BIN)/python -m bench

## Print the HTTP API's and the dashboard's latencies (needs Chromium for the latter).
bench-web: $(STAMP)
	$(BIN)/python -m bench.api_latency
	$(BIN)/python -m bench.dashboard_latency

## agentfast against LangGraph's Postgres checkpointer: round trip, bytes per paused run, runs/s (Postgres).
## BENCH_ARGS="--runs 1000" for the issue's figure; DATABASE_URL must name a database containing "bench".
bench-compare: $(BENCH_STAMP)
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

## Page, sweeper and CSV latencies over 100,000 pending approvals, 100,000 runs and 1,000,000 audit entries.
## Postgres by default (DATABASE_URL must name a database containing "bench"); BENCH_ARGS="--verbose" for EXPLAIN.
bench-scale: $(STAMP)
	$(BIN)/python -m bench.scale $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var
