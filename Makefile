# trailbound: `make demo` and `make test` do all the set-up on a fresh machine.
# Prerequisites the machine must have: Python 3.11, Java 17 and the PostgreSQL 15 server
# binaries (initdb, pg_ctl). Everything else is installed into .venv from requirements.txt.

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    := .venv
PYTHON  := $(CURDIR)/$(VENV)/bin/python
STAMP   := $(VENV)/.installed
PG_DIR  := var/pg
DEMO    := var/demo
PYSPARK := $(shell grep -E '^pyspark==' requirements.txt)

export JAVA_HOME ?= $(firstword $(wildcard /usr/lib/jvm/java-17-openjdk*) \
                      $(patsubst %/bin/java,%,$(realpath $(shell command -v java 2>/dev/null))))
export SPARK_LOCAL_IP    := 127.0.0.1
export PYSPARK_PYTHON    := $(PYTHON)
export PATH              := $(CURDIR)/$(VENV)/bin:$(PATH)
export TRAILBOUND_CONFIG ?= $(CURDIR)/include/config/trailbound.yaml
export PYTHONUNBUFFERED  := 1

# With TRAILBOUND_METADATA_DSN (and TRAILBOUND_TARGET_DSN) set, use those servers;
# otherwise start a throwaway local PostgreSQL under var/pg and point the commands at it.
ifdef TRAILBOUND_METADATA_DSN
  START_DB := @echo "Using the PostgreSQL servers named by TRAILBOUND_METADATA_DSN / TRAILBOUND_TARGET_DSN"
  DB_ENV   :=
else
  START_DB := $(PYTHON) -m trailbound.devtools.localpg start $(PG_DIR)
  DB_ENV    = env $$($(PYTHON) -m trailbound.devtools.localpg env $(PG_DIR))
endif

# The Spark that outlives the runs: a Spark Connect server (local[*], or $SPARK_MASTER) under
# var/spark-connect, whose address the commands get as SPARK_REMOTE. With SPARK_REMOTE set,
# that server is used and none is started.
CONNECT_DIR := var/spark-connect
ifdef SPARK_REMOTE
  START_CONNECT := @echo "Using the Spark Connect server $(SPARK_REMOTE)"
  CONNECT_ENV   :=
else
  START_CONNECT := $(PYTHON) -m trailbound.devtools.sparkconnect start $(CONNECT_DIR)
  CONNECT_ENV    = env $$($(PYTHON) -m trailbound.devtools.sparkconnect env $(CONNECT_DIR))
endif

# pip on some machines warns about every configured-but-absent local index: keep the noise out.
QUIET_PIP = 2>&1 | { grep -v '^WARNING: Location' || true; }; exit $${PIPESTATUS[0]}

# Airflow runs from the repository: its home under var/airflow, our dags/ and plugins/,
# Spark on the Spark Connect server (SPARK_REMOTE, from `make connect`; or define the
# spark_connect_default connection), else through the spark_default connection (local[*];
# point it at a cluster master to use one). The metadata store comes from TRAILBOUND_METADATA_DSN (or the
# trailbound_metadata connection, when you define one).
# Two DAG bundles: dags/ (this configuration's) and var/live/dags (`make demo-live`'s,
# written by the live demo), so the UI lists the live demo's DAGs beside their runs.
LOCAL_BUNDLE = {"name": "$(1)", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {"path": "$(2)"}}
AIRFLOW_ENV = AIRFLOW_HOME=$(CURDIR)/var/airflow AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
              AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST='[$(call LOCAL_BUNDLE,dags-folder,$(CURDIR)/dags), $(call LOCAL_BUNDLE,live-demo,$(CURDIR)/var/live/dags)]' \
              AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins AIRFLOW__CORE__LOAD_EXAMPLES=False \
              PYTHONPATH=$(CURDIR)/plugins AIRFLOW__API__HOST=127.0.0.1 \
              AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'

.PHONY: help install db connect browser demo demo-live demo-run demo-register test reliability bench soak env clean distclean airflow dags

help:
	@echo "make demo      set up, start a local PostgreSQL, run the pipeline on the simulated source"
	@echo "make demo-live the pipeline on a live PostgreSQL source (pgbench writing), through Airflow"
	@echo "make test      set up, start a local PostgreSQL, run the whole test suite"
	@echo "make reliability  run the crash matrix (every crash point x 3 seeds; about 7 minutes)"
	@echo "make bench     run the benchmarks and write their results under docs/benchmarks/"
	@echo "make soak      the live pipeline under Airflow's scheduler for 30 minutes, with faults (docs/benchmarks/soak.md)"
	@echo "make airflow   start airflow standalone (the UI on http://localhost:8080) with the DAGs loaded"
	@echo "make dags      regenerate dags/ from the configuration file"
	@echo "make connect   start the local Spark Connect server (var/spark-connect) the runs use"
	@echo "make clean     stop the Spark Connect server, remove the local PostgreSQL and everything under var/"
	@echo "make distclean clean, and remove .venv"

$(STAMP): requirements.txt pyproject.toml setup.py $(shell find include -name '*.pyx')
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -r requirements.txt $(QUIET_PIP)
	@# The Spark provider's pyspark-client overwrites pyspark's Python files: put pyspark back.
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --force-reinstall $(PYSPARK) $(QUIET_PIP)
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps -e . $(QUIET_PIP)
	@# The pull's hot paths in C (setup.py), next to their Python: optional, the Python runs without them.
	$(PYTHON) -W ignore setup.py -q build_ext --inplace \
	  || echo "the compiled parts were not built: the pure-Python code runs (slower)"
	touch $(STAMP)

install: $(STAMP)

db: $(STAMP)
	$(START_DB)

env: $(STAMP)
	@$(PYTHON) -m trailbound.devtools.localpg env $(PG_DIR)
	@$(PYTHON) -m trailbound.devtools.sparkconnect env $(CONNECT_DIR) 2>/dev/null || true

connect: $(STAMP)
	$(START_CONNECT)

$(DEMO)/archive/defs.json: | $(STAMP)
	trailbound simulate --archive $(DEMO)/archive --truth $(DEMO)/truth.json --records 200000 --hours 48 \
	  --schema-changes demo

# The demo's DAG runs: four logical dates 12 hours apart over the simulated 48 hours of
# log. Each capture run reads everything archived by its data interval's end (as a
# scheduled run does after a pause), so the four together cover the whole archive.
DEMO_DATES := 2026-11-01T12:00:00+00:00 2026-11-02T00:00:00+00:00 2026-11-02T12:00:00+00:00 \
              2026-11-03T00:00:00+00:00
DEMO_DAGS  := capture_ext1 pump_pmp1 replicat_rep1 retention
# `airflow dags test DAG DATE` (as trailbound_airflow.dagtest runs it: the DAG run's real
# start is recorded, not its logical date, so Airflow shows how long it really took), its
# log kept under var/demo/logs: the outcome and wall time, and the summary lines the tasks
# printed, whole (a stage's own line, or why its task was skipped).
DEMO_SUMMARY := Extract [A-Z0-9_]*: [^[]*\|EXTRACT [A-Z0-9_]* [^[]*\|Pump [A-Z0-9_]* [^[]*\|Replicat [A-Z0-9_]*: [^[]*\|PASSED: [^[]*\|Source [A-Z0-9_]* (retention [^;]*; [^;]*\|\(extract\|pump\|replicat\) [A-Z0-9_]*: nothing new [^[]*
DEMO_END     := $(lastword $(DEMO_DATES))
define dag_test
	@log=$(DEMO)/logs/$(1)_$(subst :,,$(2)).log; began=$$(date +%s); \
	$(DB_ENV) $(CONNECT_ENV) $(AIRFLOW_ENV) $(PYTHON) -m trailbound_airflow.dagtest $(1) $(2) $(3) > $$log 2>&1; \
	state=$$(grep -o 'DagRun Finished.*state=[a-z]*' $$log | tail -1 | sed 's/.*state=//'); \
	printf '  %s %s: %s (%s s)\n' $(2) $(1) "$${state:-error}" $$(( $$(date +%s) - began )); \
	grep -o "$(DEMO_SUMMARY)" $$log | sed 's/ *$$//; s/ (checked in [0-9.]* s)$$//' | uniq | sed 's/^/      /'; \
	test "$$state" = success || { echo "  -> $$log"; tail -30 $$log; exit 1; }
endef

demo: db connect $(DEMO)/archive/defs.json var/airflow/airflow.db
	@mkdir -p $(DEMO)/logs
	@echo "== the target's tables, made from the source's table definitions"
	$(DB_ENV) trailbound target create
	@echo "== the pipeline through Airflow (airflow dags test), interval by interval: logical date, DAG, outcome, wall time"
	@echo "   (the first capture run also catalogs the archive; after it, the control DAG registers"
	@echo "   EXT1 for log retention, as REGISTER EXTRACT EXT1 LOGRETENTION; logs under $(DEMO)/logs)"
	@for date in $(DEMO_DATES); do for dag in $(DEMO_DAGS); do \
	  $(MAKE) -s --no-print-directory demo-run DAG=$$dag DATE=$$date || exit 1; \
	  if [ $$dag = capture_ext1 ]; then $(MAKE) -s --no-print-directory demo-register DATE=$$date || exit 1; fi; \
	done; done
	@echo "== the replica (target database)"
	@$(DB_ENV) sh -c 'psql -X -q "$$TRAILBOUND_TARGET_DSN" -f include/sql/replica_summary.sql'
	@echo "== the checkpoint table row and the replicat's checkpoints"
	@echo "   (Lag at Chkpt is a checkpoint's wall time minus the log time of the last record it covers: the"
	@echo "   simulated log ends $(DEMO_END), so here it reads as the time since then, not as a delay)"
	$(DB_ENV) trailbound info replicat REP1 --showch
	@echo "== capture checkpoints (the same lag: measured from the simulated log's end, $(DEMO_END))"
	$(DB_ENV) trailbound info extract EXT1 --showch
	@echo
	@echo "Simulated source archive: $(DEMO)/archive   (its expected final state: $(DEMO)/truth.json)"
	@echo "Trail files:              var/dirdat/lt* (local), var/remote/rt* (shipped by PMP1; trailbound logdump FILE)"
	@echo "DAG run logs:             $(DEMO)/logs/<dag>_<date>.log; Airflow task logs under var/airflow/logs"
	@echo "Configuration:            $(TRAILBOUND_CONFIG)   (DAG files: dags/, from \`make dags\`)"
	@echo "PostgreSQL:               $(PG_DIR)/server.log; connect with: export \$$(make -s env); psql \"\$$TRAILBOUND_TARGET_DSN\""
	@echo "The Airflow UI:           make airflow   (http://localhost:8080)"

demo-run:
	$(call dag_test,$(DAG),$(DATE),$(if $(CONF),--conf '$(CONF)'))

demo-register:
	@$(DB_ENV) trailbound info retention | grep -q 'EXTRACT EXT1 *enabled' || \
	  $(MAKE) -s --no-print-directory demo-run DAG=control DATE=$(DATE) \
	    CONF='{"command": "register_logretention", "group": "EXT1", "argument": ""}'

# The live demo: a second local server (var/pg-source, wal_level=logical) is the source,
# pgbench writes to it while Airflow runs capture (pulling first), pump and replicat;
# then source and target are compared table by table. Always on the local servers.
demo-live: $(STAMP) connect var/airflow/airflow.db
	$(CONNECT_ENV) $(AIRFLOW_ENV) $(PYTHON) -m trailbound.devtools.livedemo

# The soak (docs/benchmarks/soak.md): the live pipeline run by Airflow's scheduler, triggerer
# and API server for SOAK_MINUTES while pgbench writes, with kill -9 of tasks and of the
# scheduler and restarts of both servers; then the target is compared with the source.
SOAK_MINUTES ?= 30
soak: $(STAMP)
	$(PYTHON) -m trailbound.devtools.soak --minutes $(SOAK_MINUTES) --report docs/benchmarks/soak.md

# The console's UI test drives Debian's headless Chromium and its driver: installed here
# when missing (as root, non-interactive; elsewhere install them yourself).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  test "$$(id -u)" = 0 || { echo "chromium and chromium-driver are missing: apt-get install them as root"; exit 1; }; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; }; }

test: db browser
	$(DB_ENV) $(PYTHON) -m pytest $(PYTEST_ARGS)

# The crash matrix (docs/reliability.md): every crash point x 3 seeds, kill -9 and rerun
# (marked matrix; `make test` deselects them and checks only that the plan names every point).
reliability: db
	$(DB_ENV) $(PYTHON) -m pytest -m "matrix or not matrix" tests/test_crash_matrix.py $(PYTEST_ARGS)

bench: db
	@for script in tests/bench/bench_*.py; do echo "== $$script"; $(DB_ENV) $(PYTHON) $$script || exit 1; done

dags: $(STAMP)
	trailbound dags generate --directory dags

var/airflow/airflow.db: | $(STAMP)
	mkdir -p var/airflow var/live/dags
	$(AIRFLOW_ENV) airflow db migrate > var/airflow/migrate.log

airflow: db connect var/airflow/airflow.db
	@mkdir -p var/live/dags
	$(DB_ENV) $(CONNECT_ENV) $(AIRFLOW_ENV) airflow standalone

clean:
	-test -x $(PYTHON) && $(PYTHON) -m trailbound.devtools.sparkconnect stop $(CONNECT_DIR)
	-test -x $(PYTHON) && $(PYTHON) -m trailbound.devtools.localpg remove $(PG_DIR)
	-test -x $(PYTHON) && $(PYTHON) -m trailbound.devtools.localpg remove var/pg-source
	-test -x $(PYTHON) && $(PYTHON) -m trailbound.devtools.localpg remove var/soak/pg-source
	-test -x $(PYTHON) && $(PYTHON) -m trailbound.devtools.localpg remove var/soak/pg-target
	rm -rf var .pytest_cache spark-warehouse

distclean: clean
	rm -rf $(VENV)
