# Two commands on a fresh machine:  `make dev` (daemon on the embedded default) and `make test`.
# Each one first builds .venv/ with everything it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev test lint typecheck unit integration bench bench-full sim sim-full chaos chaos-short clean

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/rasd dev

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

integration: $(STAMP)
	$(BIN)/pytest tests -q -m "integration or concurrency"

# The whole suite: lint, types, unit, integration and concurrency tests.
test: $(STAMP) lint typecheck
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench --quick

bench-full: $(STAMP)
	$(BIN)/python -m bench --full

# The global simulation: 3 regions, replication lag, the balancer against a static split.
sim: $(STAMP)
	$(BIN)/python -m sim --quick

sim-full: $(STAMP)
	$(BIN)/python -m sim --full

# The chaos run (docs/reliability.md): 5 daemons in 2 regions behind fault-injecting proxies,
# kill -9 every 6 s, one outage, the jobs on loops; an audit of what the apps saw (~11 min).
chaos: $(STAMP)
	$(BIN)/python -m chaos --duration 600

chaos-short: $(STAMP)
	$(BIN)/python -m chaos --duration 75

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
