# Two commands on a fresh machine:  `make dev` (daemon on the embedded default) and `make test`.
# Each one first builds .venv/ with everything it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# uv installs what pip would in a fifth of the time (13 s against 60 s for a fresh clone's
# venv here); where uv cannot be had, pip does it
UV     := $(BIN)/python -m pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python
PIP    := $(BIN)/python -m pip install -q

.PHONY: lock mutate dev test lint typecheck unit integration bench bench-full bench-targets bench-fleet sim sim-full check-protocol swarm chaos chaos-budget chaos-short chaos-mixed clean systemd-test tools deb \
    test-fast test-search test-property test-integration test-serial test-tiers flake-hunt

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(UV) -e '.[dev,bench]' || $(PIP) -e '.[dev,bench]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/rasd dev

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=. $(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The test tiers (tests/tiers.py, docs/testing.md); each test is in exactly one, by its markers:
#   fast         tests/unit but the two below: pure, no network; the inner loop (< 30 s)
#   search       the protocol checker's searches (marker `search`)
#   property     Hypothesis properties (`property`)
#   integration  moto's server over HTTP (`integration`)
#   serial       many processes, or a load or a run sized for the whole machine (`serial`):
#                alone, one test at a time; every other tier runs on all cores (pytest-xdist)
# ARGS go to pytest: make test-fast ARGS='-k cache -x'. A tier that selects nothing passes.
TIERS := $(BIN)/python -m tests.tiers

test-fast: $(STAMP)
	$(TIERS) fast -- $(ARGS)

test-search: $(STAMP)
	$(TIERS) search -- $(ARGS)

test-property: $(STAMP)
	$(TIERS) property -- $(ARGS)

test-integration: $(STAMP)
	$(TIERS) integration -- $(ARGS)

test-serial: $(STAMP)
	$(TIERS) serial -- $(ARGS)

# Every tier (fast, property and integration in one xdist run, then serial; the searches
# beside them at a low CPU priority; each even after one failed), then the check that they ran
# every test of the suite exactly once; ends with one line counting them all (tests/tiers.py's
# ALL).
test-tiers: $(STAMP)
	$(TIERS) all

# The flake hunt (docs/testing.md): every tier, RUNS times, beside two CPU-bound processes and
# with moto's server slowed (RASD_MOTO_DELAY, RASD_MOTO_STALLS: rasd/devtools/motoserver.py);
# then a table of each run's length, load and failed tests. Not part of `make test`.
RUNS ?= 3
flake-hunt: $(STAMP)
	$(BIN)/python -m tests.flake_hunt --runs $(RUNS)

unit: $(STAMP)
	$(TIERS) fast search property -- $(ARGS)

integration: $(STAMP)
	$(TIERS) integration serial -- $(ARGS)

# A real systemd (252+) booted in its own PID and mount namespaces, with its own /tmp, on a
# throwaway overlay of /: installs rasd, then activation, ACL, reload, restart under load,
# kill -9, watchdog, crash loop, DynamoDB down at start, log priorities, stop, exposure.
# Skips (saying why) without root, unshare or /lib/systemd/systemd. Figures: .systemd-test/.
# Tools some tests use and skip without: promtool (Debian package `prometheus`), nft
# (`nftables`).
tools:
	command -v promtool >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends prometheus; } || \
	    echo "tools: promtool could not be installed; its tests will skip"
	command -v nft >/dev/null || test -x /usr/sbin/nft || { \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    --no-install-recommends nftables; } || \
	    echo "tools: nft could not be installed; its test will skip"

# The Debian package (dh-virtualenv): build/deb/rasd_<version>_<arch>.deb. Built in a copy of
# the tree (dpkg-buildpackage writes next to the source). Installs its build deps with apt-get.
# `make deb` always builds; $(DEB_STAMP) builds only when an input of the package changed.
deb:
	command -v dh_virtualenv >/dev/null && command -v dpkg-buildpackage >/dev/null || { \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    --no-install-recommends dh-virtualenv debhelper dpkg-dev build-essential \
	    python3-venv python3-dev; }
	rm -rf build/deb && mkdir -p build/deb/rasd
	tar --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./.systemd-test \
	    --exclude=./.systemd-test-venv --exclude=./bench/results -cf - . | tar -C build/deb/rasd -xf -
	cd build/deb/rasd && dpkg-buildpackage -us -uc -b
	ls -l build/deb/*.deb

# What goes into the .deb: the Python packages (pyproject.toml's list and its readme), the
# packaging and the units, the operations page it installs. Files git knows of or would add
# (not ignored), that exist; a tree without git lists them with find. Not the Makefile:
# after a change to the `deb` recipe itself, run `make deb`.
DEB_SOURCES := rasd client jobs debian systemd docs/operations.md pyproject.toml README.md \
    requirements
DEB_INPUTS := $(wildcard $(shell git ls-files --cached --others --exclude-standard -- \
    $(DEB_SOURCES) 2>/dev/null || find $(DEB_SOURCES) -type f -not -name '*.pyc'))
DEB_STAMP := build/deb.stamp

$(DEB_STAMP): $(DEB_INPUTS)
	$(MAKE) deb
	touch $@

# Builds the .deb first where the machine allows it (root and apt-get, unless
# SYSTEMD_TEST_MANUAL=1), so the test installs, upgrades in place under load and purges it;
# otherwise it tests the documented manual layout. The .deb is rebuilt only when one of its
# inputs changed since the last build (or it is missing), niced: nothing in the build waits on
# time, and `make test` runs it beside the tests, which do.
systemd-test: $(STAMP)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ -z "$$SYSTEMD_TEST_MANUAL" ] \
	    && command -v unshare >/dev/null && [ -x /lib/systemd/systemd ]; then \
	    ls build/deb/rasd_*.deb >/dev/null 2>&1 || rm -f $(DEB_STAMP); \
	    nice -n 10 $(MAKE) $(DEB_STAMP); \
	else echo "systemd-test: not building the .deb (needs root, apt-get, unshare, systemd)"; fi
	bash tests/systemd/run.sh

# Everything CI runs: the tools some tests use, then every test tier as test-tiers runs them
# (fast, properties and integration, then the serial tier: many daemons, chaos, the
# simulation; the protocol checker's searches beside, at a low CPU priority) and, in a lane
# of its own beside them, lint and types (niced: nothing in them waits on time), then the
# real-systemd test (which skips, saying why, where the machine cannot boot systemd); then the
# check that each test ran exactly once.
test: $(STAMP) tools
	$(TIERS) all --beside 'nice -n 10 $(MAKE) -s lint typecheck && $(MAKE) -s systemd-test'

# requirements/rasd.lock: the dependencies of the .deb and the Jenkins jobs (the metrics
# extra included), pinned with their hashes for every platform, from pyproject.toml. Run it
# after changing a dependency there (a unit test checks the lock names each one).
lock: $(STAMP)
	{ sed -n '1,4p' requirements/rasd.lock; $(BIN)/uv pip compile pyproject.toml --extra metrics \
	    --generate-hashes --universal --python-version 3.11 --no-header -q; } \
	    > requirements/rasd.lock.new && mv requirements/rasd.lock.new requirements/rasd.lock
	{ sed -n '1,5p' requirements/build.lock; $(BIN)/python -c 'import tomllib; \
	    print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
	    | $(BIN)/uv pip compile - --generate-hashes --universal --python-version 3.11 \
	    --no-header -q; } > requirements/build.lock.new \
	    && mv requirements/build.lock.new requirements/build.lock

bench: $(STAMP)
	$(BIN)/python -m bench --quick

bench-full: $(STAMP)
	$(BIN)/python -m bench --full

# The targets table (docs/performance.md), every figure from one run: all scenarios in full on dynalite (keep-alive,
# as DynamoDB), 100K cached leases, 7 ms RTT. About 10-15 minutes on 2 cores.
bench-targets: $(STAMP)
	$(BIN)/python -m bench --full --backend dynalite --install-dynalite --no-plots

# The global simulation: 3 regions, replication lag, the balancer against a static split,
# over 3 seeds (docs/global.md). Exit 3: a run measured an overloaded machine, not rasd.
# sim about 13 minutes, sim-full about 65: on a quiet machine only.
# The fleet bench (docs/performance.md "A fleet"): 20 daemons and the paper's agent on one
# dynalite, sparse per-host demand, hot keys shared, sliding leases, and what DynamoDB would
# bill (bench.meter); a table, the JSON and a plot in bench/results/ (~14 min).
bench-fleet: $(STAMP)
	$(BIN)/python -m bench.fleet

# The web bench (bench/web.py): gunicorn (8 sync workers) serving a Flask app beside one daemon,
# wrk on /plain, /lease (the client's table path, then the socket alone), /paper (the paper's
# agent), /plain again; req/s, p50, p99 and each route's share of /plain (~2 min). ARGS go to
# it: make bench-web ARGS='--duration 30'. Needs wrk (Debian's package).
.PHONY: bench-web
bench-web: $(STAMP)
	@command -v wrk >/dev/null || { echo "bench-web: wrk is not installed;" \
	    "install it with: apt-get update && apt-get install -y wrk"; exit 2; }
	$(BIN)/python -m bench.web $(ARGS)

sim: $(STAMP)
	$(BIN)/python -m sim --quick --seeds 1,2,3

sim-full: $(STAMP)
	$(BIN)/python -m sim --full --seeds 1,2,3

# A strict pool beside a normal one, at 1 s and 5 s replication lag (docs/global.md).
sim-strict: $(STAMP)
	$(BIN)/python -m sim --quick --strict --seeds 1,2,3 --lag 1
	$(BIN)/python -m sim --quick --strict --seeds 1,2,3 --lag 5

# The protocol model checker (docs/checker.md): deep mode; CI runs `python -m check --quick`.
check-protocol: $(STAMP)
	$(BIN)/python -m check

# The swarm (docs/checker.md "The swarm"): every actor and every fault in random worlds,
# random and priority walks, for SWARM_SECONDS (an hour), printing progress and a closing
# summary of what it covered; a violation is shrunk and printed with the seed that replays
# it (exit 1). CI runs a fixed budget of it (tests/unit/test_check_swarm.py).
SWARM_SECONDS ?= 3600
swarm: $(STAMP)
	$(BIN)/python -m check.swarm --seconds $(SWARM_SECONDS)

# Mutation testing of the protocol's pure code (docs/checker.md "Mutation testing"): mutmut
# on rasd/core/decide.py, legacy.py, verdicts.py (the decisions and the lease's rules),
# rasd/core/writes.py, rasd/steps/, lease.py's predicates, the write builders and read-backs of
# builders.py and map_builders.py, each mutant against the unit tests and the checker's CI run
# that call it.
# Two phases: every mutant against the unit tests, then the survivors against the checker's
# searches too. Summary: printed and check/results/mutate.json. Not part of `make test`:
# estimated 45-60 min on this 2-core machine when idle (docs/checker.md has the runs).
MUTATE_STAMP := $(VENV)/.mutate-installed
$(MUTATE_STAMP): $(STAMP) pyproject.toml
	$(UV) -e '.[dev,bench,mutate]' || $(PIP) -e '.[dev,bench,mutate]'
	touch $(MUTATE_STAMP)

mutate: $(MUTATE_STAMP)
	$(BIN)/python -m check.mutate

# The chaos run (docs/reliability.md): 5 daemons in 2 regions, each region on its own replica
# joined by a replicator (last writer wins, 1 s lag), behind fault-injecting proxies; kill -9
# every 6 s, one outage, one host cut off for a minute, one host's clock stepped 5 s for a
# minute, the jobs, ras-balancer and rasadmin on loops; an audit of what the apps saw and of
# both replicas (~11 min).
chaos: $(STAMP)
	$(BIN)/python -m chaos --duration 600 --partition-at 120 --clock-step-at 360

# A pool with an outage budget (docs/reliability.md, "An outage budget"): daemon 0 cut off
# off the kills' beat, apps' leases up to 600 s; then the 5-minute outage measured alone.
chaos-budget: $(STAMP)
	$(BIN)/python -m chaos --duration 600 --seed 5 --app-max-lease 600 --release-rate 0.01 \
		--kill-every 45 --partition-at 100 --partition-for 200 --outage-budget 300 --clock-step-at 420
	$(BIN)/python -m chaos.outage

chaos-short: $(STAMP)
	$(BIN)/python -m chaos --duration 75 --partition-at 10 --clock-step-at 40 --clock-step-for 20

# The same beside the paper's agent (docs/reliability.md "Mixed fleet"): its workers on the same
# keys in both regions, behind fault-injecting proxies, and its liberator; one audit of both.
chaos-mixed: $(STAMP)
	$(BIN)/python -m chaos --mixed --duration 600 --partition-at 120 --clock-step-at 360

clean:
	rm -rf $(VENV) mutants .pytest_cache .mypy_cache .ruff_cache .systemd-test .systemd-test-venv
