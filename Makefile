# Two commands do all the set-up on a fresh machine: `make report` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINE_STAMP := $(VENV)/.engine-installed
export DAGSTER_HOME := $(CURDIR)/.dagster_home
# numba's compiled kernels kept per machine, not per checkout (keyed by each source file's
# content and the CPU): a fresh clone reuses what an earlier one compiled, as with llama.cpp.
export NUMBA_CACHE_DIR ?= $(HOME)/.cache/enginefit/numba

.PHONY: report test test-postgres lint bench bench-scale ui clean engine validate

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The real engines of the load-test tests and `make validate`: llama-cpp-python's Python server
# (compiled by pip the first time, then taken from pip's wheel cache) and llama.cpp's C++
# llama-server from the same pinned source (perf/llama_server.py: compiled once per machine,
# then taken from ~/.cache/enginefit/llama-server).
$(ENGINE_STAMP): $(STAMP) perf/llama_server.py
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/python -m pip install --quiet -e '.[dev,engine]'
	$(BIN)/python -m perf.llama_server build
	touch $(ENGINE_STAMP)

# The same, and the llama-server build again if its cache was removed since (a no-op otherwise).
engine: $(ENGINE_STAMP)
	$(BIN)/python -m perf.llama_server build

# An empty one is given enginefit's defaults (embedded SQLite) by the first `enginefit report`.
$(DAGSTER_HOME)/dagster.yaml:
	mkdir -p $(DAGSTER_HOME)
	touch $@

report: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/enginefit report --config enginefit.yaml

# One pytest worker per core; a worker that runs out of tests takes some of another's queue
# (the report tests share a published version per worker, so they had best stay together).
# Python's bytecode is kept per machine outside the checkout, as numba's kernels are, even where
# PYTHONDONTWRITEBYTECODE is set: each worker and each command a test starts would otherwise
# compile the project and rewrite the tests' asserts again (seconds a process).
test: $(STAMP) $(ENGINE_STAMP)
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(HOME)/.cache/enginefit/pycache \
	ENGINEFIT_REQUIRE_ENGINE=1 $(BIN)/python -m pytest -q -n auto --dist worksteal
	$(BIN)/ruff check pipeline assets tests perf
	$(BIN)/mypy

# Run and event storage on a real PostgreSQL: a throwaway server on loopback (initdb, pg_ctl;
# Debian: apt-get install postgresql) and docs/dagster.postgres.yaml; fails if it cannot run.
test-postgres: $(STAMP)
	ENGINEFIT_REQUIRE_POSTGRES=1 $(BIN)/python -m pytest -q tests/test_postgres_storage.py

lint: $(STAMP)
	$(BIN)/ruff check pipeline assets tests perf
	$(BIN)/ruff format --check pipeline assets tests perf
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m perf.run

# The end-to-end report at 10M, 30M and 100M generated requests over a quarter (91 days), each
# killed when its processes together hold more than 12 GiB (perf/e2e.py); traces in /tmp/scale.
# 10M and 30M in process (at 10M the stages share one flattened table); 100M with independent
# steps side by side (past simulation.curve_exact_max_blocks nothing is shared: README).
SCALE_ARGS := --span-days 91 --memory-limit 12 --traces /tmp/scale/traces
bench-scale: $(STAMP)
	$(BIN)/python -m perf.e2e --requests 10M,30M $(SCALE_ARGS) --json /tmp/scale/e2e.json
	$(BIN)/python -m perf.e2e --requests 100M $(SCALE_ARGS) --json /tmp/scale/e2e-100M.json

# The capacity model against llama.cpp's llama-server (perf/validate.py; docs/capacity.md):
# prints the signed errors. Exit 3 is "not judged: the machine was too noisy", said, not failed.
validate: engine
	$(BIN)/python -m perf.validate || test $$? -eq 3

ui: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dg dev -w workspace.yaml

clean:
	rm -rf $(VENV) $(DAGSTER_HOME)
