# carbonflow — every target sets itself up: it creates .venv and installs what it needs (idempotent).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= train,test,docs,hf,lightning
comma := ,
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt 2>/dev/null | sha1sum | cut -c1-12)-$(subst $(comma),_,$(EXTRAS))

.PHONY: install system-deps demo test test-fast docs e2e e2e-distributed bench device-wheels lint serve stop clean constraints

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing carbonflow[$(EXTRAS)] into $(VENV) (pinned by constraints.txt)…"
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: install  ## the whole pipeline once, on embedded Airflow + MLflow, replayed carbon data
	@$(BIN)/carbonflow demo

system-deps:  ## system packages the tests need (apt, when root) and the local PostgreSQL started
	@bash scripts/system-deps.sh

test: install system-deps docs  ## everything CI runs: system packages, the docs build, the whole test suite
	@$(BIN)/python -m pytest

test-fast: install  ## the development loop: every test but the slow, browser and distributed ones (no PostgreSQL, no apt)
	@$(BIN)/python -m pytest -m "not slow and not postgres" -n 2 --dist loadfile

docs: install  ## the documentation site (MkDocs Material, API reference from docstrings) into site/, strict
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

e2e: install  ## stack-level tests: real Airflow services + MLflow server + headless Chromium
	@$(BIN)/python -m pytest -m slow tests/e2e

e2e-distributed: install system-deps  ## Airflow on CeleryExecutor (Redis, PostgreSQL), 2 workers + triggerer, fake 4-GPU node, faults
	@$(BIN)/python -m pytest tests/e2e/test_distributed.py

bench:  ## every benchmark in benchmarks/ (results in benchmarks/results/)
	@$(MAKE) --no-print-directory install EXTRAS=train,test,bench
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lint: install
	@$(BIN)/ruff check . && $(BIN)/ruff format --check carbonflow dags tests benchmarks

device-wheels:  ## wheels a GPU machine without network needs for benchmarks/gpu_check.py, into .whl/ (docs/gpu-check.md)
	@bash scripts/device-wheels.sh .whl

serve: install  ## start Airflow (api-server, scheduler, dag-processor, triggerer) and MLflow on dags/ (DAGS=dir: your own)
	@CARBONFLOW_DAGS_FOLDER="$(if $(DAGS),$(abspath $(DAGS)),$${CARBONFLOW_DAGS_FOLDER:-})" bash scripts/serve.sh

stop:  ## stop what `make serve` started
	@bash scripts/stop.sh

constraints:  ## re-resolve and pin every dependency (needs the network to PyPI)
	@rm -rf .venv-resolve && $(PYTHON) -m venv .venv-resolve
	@.venv-resolve/bin/python -m pip install -q --upgrade pip
	@.venv-resolve/bin/python -m pip install -q -e ".[train,test,bench]"
	@.venv-resolve/bin/python -m pip freeze --exclude-editable | grep -v '^carbonflow' > constraints.txt
	@rm -rf .venv-resolve && echo "constraints.txt updated"

clean:
	rm -rf .carbonflow site
