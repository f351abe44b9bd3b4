# Two entry points for a fresh machine:
#   make plan   installs superkube and plans the built-in default stack (dev) offline
#   make test   installs everything the tests need and runs every test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STACK ?= dev

.PHONY: plan test lint lint-quick install install-test bench debian-deps doctor

$(BIN)/python:
	@echo "making the virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The package is installed editable: a stamp per extra says it is, and pip runs again only when
# what it installs from changes (pyproject.toml, constraints.txt), not at every `make plan`.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	@echo "installing superkube and its dependencies into $(VENV) (the first time: a few minutes)"
	$(BIN)/pip install --progress-bar on -c constraints.txt -e .
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml constraints.txt
	@echo "installing the test tools into $(VENV)"
	$(BIN)/pip install --progress-bar on -c constraints.txt -e '.[test]'
	@touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

plan: install
	$(BIN)/superkube plan --stack $(STACK)

lint: lint-quick
	$(BIN)/mypy

# every check but mypy (a minute from cold, so `make test` runs it beside the tests)
lint-quick: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/superkube config-schema --check
	cd playbooks && ../$(BIN)/ansible-lint -c ../.ansible-lint .

debian-deps:
	bash scripts/debian-deps.sh

# what this machine lacks for the offline plan, the lab and Azure (PATHS="lab" for one), before
# anything is installed: the system's python3 and the standard library alone
doctor:
	@$(PYTHON) src/superkube/cli/prerequisites.py $(PATHS)

# Debian packages first: the virtualenv itself may need python3-venv. Then the suite in lanes
# (scripts/run_tests.py): the linters, the unit tests and mypy run beside the components' build and
# the lab's runs; the target fails if any step does, after every step has ended.
test: debian-deps install-test
	$(BIN)/python scripts/run_tests.py

bench: install-test debian-deps
	$(BIN)/python bench/plan.py
	$(BIN)/python bench/check.py
	$(BIN)/python bench/exporter.py
	$(BIN)/python bench/pod_accounting.py
	$(BIN)/python bench/converge.py
	$(BIN)/python bench/render.py
	$(BIN)/python bench/join_storm.py
	$(BIN)/python bench/join_flow.py
	$(BIN)/python bench/gang.py
	$(BIN)/python bench/pod_network.py
	$(BIN)/python bench/monitoring.py
	$(BIN)/python bench/team_webhook.py
	$(BIN)/python bench/build.py
	$(BIN)/python bench/agents_at_scale.py
	$(BIN)/python bench/real_nodes.py
	$(BIN)/python bench/training_job.py
	$(BIN)/python bench/dns.py
	$(BIN)/python bench/figures.py --write
