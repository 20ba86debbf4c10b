# `make run` and `make test` each set up everything on a fresh machine, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run shell test check lint typecheck unit bench chaos etcd mosquitto fuse java java-if-possible jdk chromium redis zmq-headers compiler clean .venv-dynamo .node-nats

# What `make run` needs (the event plane, streams, Spark, nats-server) at the exact versions of
# constraints.txt; the tests and benchmarks add their tools. A user's `pip install meshplane[...]`
# takes any version in pyproject's ranges.
RUN_STAMP := $(VENV)/.installed-run
$(RUN_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,examples]'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) | compiler
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,examples,dev,bench]'
	touch $(STAMP)

## run: a local event plane (embedded nats-server, file discovery), the streams server and the Spark
## pipeline, with demo traffic; Ctrl-C stops it (`meshplane up --no-pipeline` for a light run)
run: $(RUN_STAMP) java-if-possible
	$(BIN)/meshplane up

## shell: your shell with meshplane on PATH (the venv's bin first, after your rc files: pyenv's or
## conda's shims cannot hide it); exit returns to yours
shell: $(RUN_STAMP)
	@$(BIN)/meshplane shell

## etcd: install etcd from Debian when it is missing (tests start a real etcd)
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server; \
	  else echo "etcd is missing and apt-get is not available: install etcd 3.4+ and retry" >&2; exit 1; fi; }

## mosquitto: install Debian's mosquitto broker and clients when missing (the MQTT door's tests run
## mosquitto_pub / mosquitto_sub against mesh nodes; its benchmark runs the broker beside a node)
mosquitto:
	@{ command -v mosquitto_pub >/dev/null 2>&1 && { command -v mosquitto >/dev/null 2>&1 || test -x /usr/sbin/mosquitto; }; } || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto mosquitto-clients; }

## fuse: install Debian's libfuse3 when it is missing (the fault harness's power-loss filesystem runs on it)
fuse:
	@{ ldconfig -p | grep -q 'libfuse3\.so\.3' && command -v fusermount3 >/dev/null 2>&1; } || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libfuse3-3 fuse3; }

## compiler: install a C compiler and Python's headers from Debian when missing: meshplane's C extension
## (the ZeroMQ and NATS hot paths, the mesh frame reader) is optional for users; the tests check it is built
compiler:
	@{ command -v cc >/dev/null 2>&1 && \
	  test -f "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" && \
	  test -f /usr/include/zlib.h; } || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc python3-dev zlib1g-dev; }

## java: install a Java 17 runtime from Debian when java is missing (the Spark tests run a real Spark)
java:
	@command -v java >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openjdk-17-jre-headless; }

## chromium: install Debian's chromium when it is missing (the dashboard tests drive a real browser)
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

# java-if-possible: the same, but without apt or permission `make run` goes on (the pipeline then
# says it needs Java and the rest runs)
java-if-possible:
	@command -v java >/dev/null 2>&1 || $(MAKE) --no-print-directory java || \
	  echo "no Java 17: meshplane up runs without the Spark pipeline" >&2

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

## test: ruff, mypy and the whole pytest suite (real nats-server, etcd, ZeroMQ, streams server, Spark,
## the dashboard in a headless chromium, and the Dynamo runtime as a peer), one test at a time
test: $(STAMP) etcd mosquitto java chromium fuse .venv-dynamo .node-nats lint typecheck
	$(BIN)/pytest

# make check runs the tests that wait on servers 4 at a time (pytest-xdist, a file per worker for its
# module's servers): one at a time they kept 0.7 of a core busy. The schemathesis fuzzer goes first, one
# test at a time (xdist's workers fold its routes into one test). make test stays one at a time: four at
# a time, tests with timing bounds failed now and then (three CI runs, a different one each time).
PARALLEL := -n 4 --dist loadfile

## check: the quick loop: ruff, mypy and every test but the fault harness's runs and those starting
## a Spark JVM (markers chaos and spark_jvm), those that wait on servers 4 at a time
check: $(STAMP) etcd mosquitto chromium .node-nats lint typecheck
	status=0; $(BIN)/pytest -m "serial and not (chaos or spark_jvm)" || status=$$?; \
	  $(BIN)/pytest -m "not (chaos or spark_jvm or serial)" $(PARALLEL) || status=$$?; exit $$status

## chaos: the fault harness's full schedule (root): every workload under each nemesis, then all mixed,
## with --fsync always and interval; the table goes to docs/chaos.md
chaos: $(STAMP) fuse
	$(BIN)/python -m tests.chaos --workload all --nemesis each --fsync always,interval --duration 30 \
	  --markdown docs/chaos.md

## redis: install redis-server from Debian when it is missing (the streams benchmark runs it)
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server; }

## zmq-headers: install zmq.h from Debian when it is missing (bench/zmq_ceiling.c is built against it)
zmq-headers: compiler
	@test -f /usr/include/zmq.h || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libzmq3-dev; }

## jdk: install Debian's JDK when javac is missing (bench/spark_ingest.py compiles a JVM data source)
jdk:
	@command -v javac >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openjdk-17-jdk-headless; }

## bench: every benchmark against its raw peer in the same run (writes bench/results/)
bench: $(STAMP) redis zmq-headers jdk .venv-dynamo .node-nats
	$(BIN)/meshplane bench

## .venv-dynamo: the Dynamo runtime (ai-dynamo-runtime 1.6.1), the peer of the interop tests
## (tests/integration/test_dynamo_runtime.py) and of the event-plane benchmark, in a venv of its own (it
## pins a pydantic older than meshplane's); `make run` does without it
.venv-dynamo: .venv-dynamo/.installed
.venv-dynamo/.installed:
	test -x .venv-dynamo/bin/python || $(PYTHON) -m venv .venv-dynamo
	.venv-dynamo/bin/python -m pip install --quiet ai-dynamo-runtime==1.6.1
	touch $@

## .node-nats: the JavaScript NATS client from npm (nats 2.29.3, run with Node 20), a peer of the NATS
## door's tests (tests/integration/test_nats_door_peers.py) and benchmark
.node-nats: .node-nats/.installed
.node-nats/.installed:
	@command -v npm >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm; }
	npm install --silent --no-audit --no-fund --prefix .node-nats nats@2.29.3
	touch $@

clean:
	rm -rf $(VENV) .venv-dynamo .node-nats .mypy_cache .ruff_cache .pytest_cache .hypothesis
