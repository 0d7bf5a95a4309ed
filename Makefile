# Two commands do all the set-up on a fresh clone:
#   make demo   install into .venv and run the demo pipeline end to end
#   make test   install into .venv and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
# The instance's template: dagster.yaml (SQLite) or dagster.postgres.yaml (see that file).
DAGSTER_YAML ?= dagster.yaml
export LAMINAR_DAGSTER_YAML := $(abspath $(DAGSTER_YAML))

.PHONY: install class-archive test-jars test-azurite chromium redis demo demo-s3 ui-s3 demo-gcs demo-azure test test-fast test-quick quality lint typecheck ui clean bench bench-smoke soak
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The s3a jars (hadoop-aws and the AWS SDK modules it uses) and delta-spark's jars from Maven Central,
# once, into the venv: the check returns at once when they are there.
install: $(VENV)/.installed
	@$(BIN)/python -m laminar_assets.deploy.jar_installer s3 delta
	@$(BIN)/python -m laminar_assets.deploy.jar_installer gcs  # Spark's GCS connector (gs:// lakes)
	@$(BIN)/python -m laminar_assets.deploy.jar_installer azure  # ABFS (abfss://): hadoop-azure, engine/spark/jars.py
	@$(BIN)/python -m laminar_assets.deploy.jar_installer postgres  # pgjdbc: a Hive metastore on Postgres (docs/catalog.md)

# uv (from PyPI) installs the same packages as pip, faster: 44 s against 60 s for pip with a warm cache
# (docs/testing.md); the venv keeps its pip for users' own installs. --compile-bytecode as pip does: where
# PYTHONDONTWRITEBYTECODE is set, a venv without .pyc files compiles Dagster's modules in every process
# (the tests that start processes took 2-3x the CPU).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[dev]"
	@# the project's own packages too (an editable install leaves them out): 0.17 s less for each
	@# `laminar` command where bytecode is never written; a .pyc checked by its source's hash, so an
	@# edited file is compiled afresh, never read stale
	@$(BIN)/python -m compileall -q --invalidation-mode checked-hash laminar_assets bench > /dev/null
	@$(BIN)/python -c "from laminar_assets.engine import check_java; check_java()" || \
		(echo "Laminar needs Java 17+ for Spark (see the message above)"; exit 1)
	touch $@

# Spark JVMs start about twice as fast with an archive of the classes Laminar's work loads: written
# after install (~1 min) and again after a JDK or pyspark update; otherwise this returns at once.
class-archive: install
	@$(BIN)/python -m laminar_assets.deploy.class_archive_writer || echo "(continuing: Spark starts without the class archive)"

$(DAGSTER_HOME)/dagster.yaml: $(DAGSTER_YAML)
	mkdir -p $(DAGSTER_HOME)
	cp $(DAGSTER_YAML) $@

demo: class-archive $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/laminar demo

# The demo and the deployment with the lake in a bucket of a local emulator (on 127.0.0.1, in memory):
# the same commands, pointed at the bucket through LAMINAR_ROOT and the store's usual variables
# (laminar_assets/deploy/local_store.py). S3: moto; GCS: fake-gcs-server; Azure: Azurite (Node.js).
demo-s3: class-archive $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m laminar_assets.deploy.local_store s3 -- $(BIN)/laminar demo

ui-s3: class-archive $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m laminar_assets.deploy.local_store s3 -- $(BIN)/laminar serve

demo-gcs: class-archive $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m laminar_assets.deploy.local_store gcs -- $(BIN)/laminar demo

demo-azure: class-archive test-azurite $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m laminar_assets.deploy.local_store azure -- $(BIN)/laminar demo

# The local deployment: a Spark Connect server + `dagster dev` (UI and daemon) on 127.0.0.1; Ctrl-C stops both.
ui: class-archive $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/laminar serve

# Test processes (pytest-xdist), each with its own Spark session; a file's tests stay in one process, so
# its fixtures are built once (a long test sharded by tests/conftest.py `shards` goes out shard by shard).
# TEST_WORKERS=0 runs in one process. Files go out in collection order, which tests/conftest.py starts
# with the slowest ones. The end of the output lists the slowest files with their wall and CPU seconds
# against a budget (tests/timing.py, docs/testing.md). Three processes on two cores: many tests wait on
# servers and child processes (a cluster's JVMs, `dagster dev`, run workers), and the third process
# fills those waits (docs/testing.md: the test phase 1965 s with two, 1447 s with three).
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: class-archive chromium redis test-jars
	$(PYTEST) --durations=15

# s3proxy, a local S3 server with honest conditional writes, for the tests that race two writers.
test-jars: install
	@$(BIN)/python -m laminar_assets.deploy.jar_installer s3proxy
	@$(BIN)/python -m laminar_assets.deploy.azurite install  # Azurite (npm), the Azure tests' emulator, once

# Azurite alone (the Azure tests' emulator, from npm into the venv); `test-jars` installs it too.
test-azurite:
	@$(BIN)/python -m laminar_assets.deploy.azurite install

# The deployment test checks the Dagster UI in headless Chromium (Debian's package): install it if missing.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$LAMINAR_CHROMIUM" ] || \
	  ( echo "installing Debian's chromium package (the UI test drives it headless)"; \
	    $(SUDO) apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null) ) || \
	  ( echo "the UI test needs Chromium: install it (Debian: apt-get install chromium) or set LAMINAR_CHROMIUM"; exit 1 )

# The Redis export tests run a throwaway redis-server (Debian's package) on 127.0.0.1: install it if missing.
redis:
	@command -v redis-server >/dev/null || \
	  ( echo "installing Debian's redis-server package (the Redis export tests start it on 127.0.0.1)"; \
	    $(SUDO) apt-get install -y -qq redis-server >/dev/null 2>&1 || \
	    ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null) ) || \
	  ( echo "the Redis export tests need redis-server: install it (Debian: apt-get install redis-server)"; exit 1 )

# Quality gate: the demo at a small size, then every contract and equivalence check.
quality: class-archive $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/laminar --root .laminar/quality check --demo --rows 200

# The random stateful test (tests/engine/stateful_lake.py) for a time budget, seed after seed; a failure
# prints its smallest history and one line that reproduces it. E.g. SOAK_ARGS='--seconds 3600 --seed 7'.
# Its histories export to a Postgres, a Redis server and a webhook receiver it starts (SOAK_ARGS='--no-exports': none).
SOAK_ARGS ?= --seconds 600
soak: class-archive redis
	$(BIN)/python -m tests.soak $(SOAK_ARGS)

# ruff over the package, the benchmark and the tests (pyproject.toml's [tool.ruff]), and the type checker over
# the package (`typecheck`); CI runs both.
lint: typecheck
	$(BIN)/ruff check laminar_assets bench tests

# mypy over laminar_assets/ (pyproject.toml's [tool.mypy]: the modules still listed there have their errors
# silenced; the list only shrinks). ~15 s cold, a second or two from its cache (.mypy_cache/).
typecheck: install
	$(BIN)/mypy

# Between two changes (docs/testing.md): test-fast needs no Spark and no process of its own (the small
# servers some tests use, PostgreSQL and Redis, start in seconds); test-quick adds one representative of each
# area that does (tests/conftest.py QUICK), with sixteen random stateful histories (a few minutes).
test-fast: install redis
	$(PYTEST) -m "not (spark or deployment or process)"

test-quick: class-archive test-jars redis
	LAMINAR_STATEFUL_EXAMPLES=16 $(PYTEST) -m "quick or not (spark or deployment or process)"

# Benchmark (bench/README.md): incremental vs refill vs full recompute vs Structured Streaming,
# scaling with table size, end-to-end freshness. Reports numbers; fails only on wrong answers.
bench: class-archive
	$(BIN)/python -m bench.run --profile full $(BENCH_ARGS)

bench-smoke: class-archive
	$(BIN)/python -m bench.run --profile smoke $(BENCH_ARGS)

clean:
	rm -rf .laminar .dagster_home
