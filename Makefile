# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test bench check-java chromium postgresql wrk clean kafka-jars kafka typecheck lint docs cluster
CHROMIUM ?= $(or $(XSG_CHROMIUM),/usr/bin/chromium)

# The consumer's client (client/, package xsg_client) is a distribution of its own; the gateway's
# `xsg read` and the tests use it, so it is installed beside the gateway (editable).
$(STAMP): setup.cfg pyproject.toml client/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]' -e ./client
	@touch $(STAMP)

install: check-java $(STAMP) kafka-jars

check-java:
	@deploy/check_java.sh

# `make run PORT=9000 PROXY_PORT=9001`: the gateway's port (default 8080, or XSG_PORT) and its
# caching proxy's (default the gateway's + 1, else 8081); the banner prints the URLs.
PORT ?=
PROXY_PORT ?= $(if $(PORT),$(shell expr $(PORT) + 1),8081)
run: install
	$(VENV)/bin/xsg serve $(if $(PORT),--port $(PORT)) --proxy-port $(PROXY_PORT)

# One gateway of several processes on this machine (deploy/local-cluster.sh): PostgreSQL, a Spark
# standalone master and worker, PROCESSES gateway processes and the proxy in front; EDGES=N adds a
# Kafka broker and N edges (delivery through plan topics); Ctrl-C stops all.
cluster: install postgresql
	XSG_PROCESSES=$(or $(PROCESSES),2) $(if $(PORT),XSG_PORT=$(PORT)) \
	  $(if $(EDGES),XSG_EDGES=$(EDGES)) deploy/local-cluster.sh

# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file each at a time: most of
# its time is spent waiting on Spark's micro-batches and on child processes, not computing, so
# two workers finish it in about two thirds of the time on 2 cores. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: install chromium postgresql
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The console's browser tests (tests/console) drive Debian's headless chromium through Playwright.
# Installed here when missing and apt-get can be used (as root); otherwise those tests skip and say
# what to install.
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium (apt-get) for the console's browser tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends chromium >/dev/null) \
	      || echo "could not install chromium: the console's browser tests will skip"; \
	  else \
	    echo "no $(CHROMIUM): the console's browser tests will skip (apt-get install chromium)"; \
	  fi; \
	fi

# The store tests run on SQLite and on PostgreSQL: tests/pg_server.py starts Debian's server
# binaries (initdb, pg_ctl, postgres) in a temporary folder for the session. Installed here when
# missing and apt-get can be used (as root), without the cluster and service the package would
# otherwise create (createcluster.conf); otherwise those tests skip and say what to install.
postgresql:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	    && ! command -v initdb >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing postgresql (apt-get) for the PostgreSQL store tests"; \
	    if [ ! -e /etc/postgresql-common/createcluster.conf ]; then \
	      mkdir -p /etc/postgresql-common && \
	      echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf; \
	    fi; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends postgresql >/dev/null) \
	      || echo "could not install postgresql: the PostgreSQL store tests will skip"; \
	  else \
	    echo "no PostgreSQL server binaries: the PostgreSQL store tests will skip" \
	      "(apt-get install postgresql)"; \
	  fi; \
	fi

# The HTTP benchmarks (tests/bench/bench_pdp.py) load the server with wrk; without it they say so.
wrk:
	@if ! command -v wrk >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing wrk (apt-get) for the HTTP benchmarks"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends wrk >/dev/null) \
	      || echo "could not install wrk: bench_pdp.py will skip its wrk rows"; \
	  else \
	    echo "no wrk: bench_pdp.py will skip its wrk rows (apt-get install wrk)"; \
	  fi; \
	fi

# Spark's Kafka connector for the installed pyspark and a Kafka broker with its console tools, from
# Maven Central into .cache/kafka/ (once; later runs do nothing). Without mvn it says what to
# install, and Kafka streams and their tests then say so too.
kafka-jars: $(STAMP)
	@deploy/fetch_kafka_jars.sh $(PY)

# A single-node Kafka broker (KRaft) on 127.0.0.1:9092 for trying Kafka streams (README); Ctrl-C
# stops it. KAFKA_PORT=... picks another port.
KAFKA_PORT ?= 9092
kafka: install
	$(PY) -m tests.kafka.broker --port $(KAFKA_PORT) --data-dir data/kafka

bench: install wrk
	for f in tests/bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The documentation site (mkdocs.yml, docs/) into site/; tests/test_docs.py builds it with
# --strict in `make test`. `$(VENV)/bin/mkdocs serve` shows it while writing.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The type checker alone (tests/test_types.py runs the same): settings in setup.cfg's [mypy].
typecheck: install
	$(PY) -m mypy

# The linter alone (tests/test_lint.py runs the same): settings in ruff.toml. `ruff check --fix`
# repairs the safe findings. The formatter (`ruff format`) is not adopted (docs/tests.md).
lint: install
	$(VENV)/bin/ruff check .
