# Two entry points for a fresh machine:
#   make plan   installs superkube and plans the built-in default stack (dev) offline
#   make test   installs everything the tests need and runs every test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STACK ?= dev

.PHONY: plan test lint install install-test bench debian-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e .

install-test: $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'

plan: install
	$(BIN)/superkube plan --stack $(STACK)

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/superkube config-schema --check
	cd playbooks && ../$(BIN)/ansible-lint -c ../.ansible-lint .

debian-deps:
	bash scripts/debian-deps.sh

# Debian packages first: the virtualenv itself may need python3-venv
test: debian-deps lint
	$(BIN)/python -m pytest

bench: install-test debian-deps
	$(BIN)/python bench/plan.py
	$(BIN)/python bench/check.py
	$(BIN)/python bench/exporter.py
	$(BIN)/python bench/converge.py
	$(BIN)/python bench/render.py
	$(BIN)/python bench/join_storm.py
	$(BIN)/python bench/pod_network.py
	$(BIN)/python bench/monitoring.py
