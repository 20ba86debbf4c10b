# `make run` and `make test` each set up everything on a fresh machine, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench etcd clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## run: start a local event plane (embedded nats-server, file discovery) with demo traffic; Ctrl-C stops it
run: $(STAMP)
	$(BIN)/meshplane up

## etcd: install etcd from Debian when it is missing (tests start a real etcd)
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server; \
	  else echo "etcd is missing and apt-get is not available: install etcd 3.4+ and retry" >&2; exit 1; fi; }

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

## test: ruff, mypy and the whole pytest suite (real nats-server, etcd, ZeroMQ)
test: $(STAMP) etcd lint typecheck
	$(BIN)/pytest

## bench: the event-plane benchmark against raw pyzmq and nats-py (writes bench/results/)
bench: $(STAMP)
	$(BIN)/python bench/event_plane.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
