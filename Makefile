# Two commands do all the set-up on a fresh machine: `make report` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME := $(CURDIR)/.dagster_home

.PHONY: report test lint bench ui clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(DAGSTER_HOME)/dagster.yaml:
	mkdir -p $(DAGSTER_HOME)
	touch $@

report: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/enginefit report --config enginefit.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q
	$(BIN)/ruff check pipeline assets tests perf
	$(BIN)/mypy

lint: $(STAMP)
	$(BIN)/ruff check pipeline assets tests perf
	$(BIN)/ruff format --check pipeline assets tests perf
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m perf.run

ui: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dg dev -w workspace.yaml

clean:
	rm -rf $(VENV) $(DAGSTER_HOME)
