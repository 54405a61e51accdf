# The one entry point: the README and .ci/run use these targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MONTH ?= 2025-06
USERS ?= 20000

.PHONY: install demo test lint format clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed  ## a virtualenv with batchrun and its dev tools

demo: install  ## the birthday job on the embedded default: SQLite, file outbox, local retry queue
	rm -rf .demo && mkdir -p .demo
	cd .demo && ../$(BIN)/batchrun db migrate
	cd .demo && ../$(BIN)/batchrun db seed --users $(USERS)
	cd .demo && ../$(BIN)/batchrun birthday --month $(MONTH) --dry-run
	cd .demo && ../$(BIN)/batchrun birthday --month $(MONTH)
	cd .demo && ../$(BIN)/batchrun birthday --month $(MONTH)
	cd .demo && ../$(BIN)/batchrun status --month $(MONTH)
	@echo "emails written to .demo/outbox: $$(ls .demo/outbox | wc -l)"

test: install  ## the test suite (MySQL tests need MariaDB on 127.0.0.1:3306, or BATCHRUN_TEST_MYSQL_URL)
	$(BIN)/python -m pytest

lint: install  ## ruff and mypy --strict
	$(BIN)/ruff check batchrun tests
	$(BIN)/ruff format --check batchrun tests
	$(BIN)/mypy

format: install
	$(BIN)/ruff format batchrun tests
	$(BIN)/ruff check --fix batchrun tests

clean:
	rm -rf .demo dist build *.egg-info .pytest_cache .mypy_cache .ruff_cache
