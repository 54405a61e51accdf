# The one entry point: the README and .ci/run use these targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MONTH ?= 2025-06
USERS ?= 20000

.PHONY: install demo test lint format clean

# Two steps: batchrun and its runtime dependencies (all `make demo` needs), then the dev
# tools (moto, cfn-lint, mypy, ruff, pytest ...) for `make install` / `make test`.
$(BIN)/.runtime: pyproject.toml
	@echo "==> installing batchrun and its runtime dependencies into $(VENV) (make install adds the dev tools)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e .
	@touch $@

$(BIN)/.installed: $(BIN)/.runtime
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed  ## a virtualenv with batchrun and its dev tools

DEMO := cd .demo && ../$(BIN)/batchrun

demo: $(BIN)/.runtime  ## the birthday job on the embedded default: SQLite, file outbox, local retry queue
	@rm -rf .demo && mkdir -p .demo
	@echo "==> 1/6 a new SQLite database, .demo/batchrun.db: create the schema (db migrate)"
	@$(DEMO) db migrate
	@echo "==> 2/6 add $(USERS) demo users, a few inactive or with a bad address (db seed)"
	@$(DEMO) db seed --users $(USERS)
	@echo "==> 3/6 what the $(MONTH) birthday run would do; writes and sends nothing (--dry-run)"
	@$(DEMO) birthday --month $(MONTH) --dry-run
	@echo "==> 4/6 the run: one gift card and one email to each user born in $(MONTH)"
	@$(DEMO) birthday --month $(MONTH)
	@echo "==> 5/6 the same run again: everyone is done, so nothing new happens"
	@$(DEMO) birthday --month $(MONTH)
	@echo "==> 6/6 where the month stands (status)"
	@$(DEMO) status --month $(MONTH)
	@echo "==> done: $$(ls .demo/outbox | wc -l) emails written to .demo/outbox; make test runs the tests"
	@echo "==> batchrun is in $(BIN): put it on PATH with  export PATH=\"$$PWD/$(BIN):\$$PATH\"  (or run $(BIN)/batchrun)"

# Test processes (pytest-xdist): most tests wait on servers, so two share the 2 cores well.
TEST_WORKERS ?= 2

test: install  ## the test suite (needs MariaDB on 127.0.0.1:3306 and PostgreSQL on 127.0.0.1:5432, or BATCHRUN_TEST_MYSQL_URL / BATCHRUN_TEST_POSTGRES_URL)
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

lint: install  ## ruff and mypy --strict
	$(BIN)/ruff check batchrun tests deploy bench
	$(BIN)/ruff format --check batchrun tests deploy bench
	$(BIN)/mypy
	$(BIN)/mypy deploy/build_lambda.py

format: install
	$(BIN)/ruff format batchrun tests
	$(BIN)/ruff check --fix batchrun tests

clean:
	rm -rf .demo dist build *.egg-info .pytest_cache .mypy_cache .ruff_cache

.PHONY: email-picture

email-picture: install  ## docs/birthday-email.png, the README's picture of the default email (needs chromium)
	$(BIN)/python docs/email_picture.py

.PHONY: dashboard-picture

dashboard-picture: install  ## docs/dashboard.png, the README's picture of `batchrun ui` during a run (needs chromium and chromium-driver)
	$(BIN)/python docs/dashboard_picture.py

.PHONY: bench bench-quick bench-migrate bench-lean bench-tasks bench-versus

bench: install  ## the benchmark: 100k and 1M users vs the seed's naive algorithm and the SMTP ceiling, the lean comparison at 1M, then bench-migrate, bench-tasks and bench-versus (MariaDB on 127.0.0.1:3306)
	$(BIN)/python -m bench.run --repeat 3 --json bench/results.json
	$(MAKE) bench-migrate
	$(MAKE) bench-tasks
	$(MAKE) bench-versus

TASKS ?= 20000
TASK_ENTITIES ?= 2000

bench-tasks: install  ## one worker's no-op tasks per second on the local queue (MariaDB): TASKS over TASK_ENTITIES entities, and each task its own entity
	$(BIN)/python -m bench.tasks_rate --tasks $(TASKS) --entities $(TASK_ENTITIES) --json bench/results-tasks.json

LEAN_USERS ?= 1000000
LEAN_REPEAT ?= 1

bench-lean: install  ## only the lean comparison: batchrun vs bench/lean.py at concurrency 50 and 200, on the bench's sink and Postfix's smtp-sink (LEAN_USERS=1000000)
	$(BIN)/python -m bench.run --sizes $(LEAN_USERS) --lean-only --repeat $(LEAN_REPEAT) --json bench/results-lean.json

VERSUS_BASE ?= f49fa90
VERSUS_USERS ?= 1000000

bench-versus: install  ## the birthday run of this tree against VERSUS_BASE's (f49fa90, where "One path for every entity" began), alternating on one smtp-sink
	$(BIN)/pip install -q aiolimiter  # f49fa90 still imports it; this tree does not
	$(BIN)/python -m bench.versus --base $(VERSUS_BASE) --users $(VERSUS_USERS) --rounds 2

MIGRATE_ROWS ?= 2000000

bench-migrate: install  ## the longest application write `db migrate` blocks, at 2,000,000 users (and the earlier STORED column's)
	$(BIN)/python -m bench.migrate_stall --rows $(MIGRATE_ROWS) --stored --json bench/migrate-stall.json

bench-quick: install  ## a smoke run of the benchmark: 20k users, naive at 5k and 20k
	$(BIN)/python -m bench.run --quick --json bench/results-quick.json

# The Lambda zips (deploy/README.md). LAMBDA_PYTHON: a python3.12 to precompile with
# (.pyc files halve the cold start); without one on PATH the zips ship sources only.
LAMBDA_PYTHON ?=
LAMBDA_COMPILE := $(if $(LAMBDA_PYTHON),--compile-with $(LAMBDA_PYTHON))
# LAMBDA_JOBS: a folder of your job modules to bundle (BATCHRUN_JOBS=/var/task/<folder>/x.py).
LAMBDA_JOBS ?=
LAMBDA_COMPILE += $(if $(LAMBDA_JOBS),--jobs-dir $(LAMBDA_JOBS))

.PHONY: lambda
lambda: install  ## dist/batchrun-lambda.zip (x86_64) and dist/batchrun-lambda-arm64.zip, for python3.12
	$(BIN)/python deploy/build_lambda.py --arch x86_64 --python 3.12 --out dist/batchrun-lambda.zip $(LAMBDA_COMPILE)
	$(BIN)/python deploy/build_lambda.py --arch arm64 --python 3.12 --out dist/batchrun-lambda-arm64.zip $(LAMBDA_COMPILE)

# The long fault-injection variants (tests/guarantees/test_soak.py), skipped by `make test` and CI:
# crash-anywhere iterations per database with 1% temporary failures, and a load run of
# SOAK_USERS users with 1% temporary failures against an SMTP sink in its own process.
# Every user is born in the month (1,000,000 emails); SOAK_ALL_IN_MONTH=0 seeds them with
# `batchrun db seed` instead (a twelfth of them in the month). The crash-anywhere variant
# with a failing heartbeat runs with a lease of SOAK_LEASE_S seconds and a share
# SOAK_HEARTBEAT_FAIL of heartbeats failing at random (tests/support/soak_hooks, subprocesses only).
SOAK_ITERATIONS ?= 100
SOAK_USERS ?= 1000000
SOAK_ALL_IN_MONTH ?= 1
SOAK_LEASE_S ?= 3
SOAK_HEARTBEAT_FAIL ?= 0.3
# tests/guarantees/test_soak_skew.py: per iteration two runs through a TCP proxy dropping a share
# SOAK_DROP_CHANCE of the replies to batchrun's and the job's statements, the second under
# `faketime -f SOAK_SKEW` (past its lease of SOAK_SKEW_LEASE_S seconds), on MariaDB and
# PostgreSQL. SOAK_TESTS picks the files (e.g. SOAK_TESTS=tests/guarantees/test_soak_skew.py).
SOAK_SKEW ?= +5s
SOAK_SKEW_LEASE_S ?= 4
SOAK_DROP_CHANCE ?= 0.02
# tests/guarantees/test_soak_tasks.py: SOAK_TASKS submitted tasks (4 an entity) served by 3 `batchrun
# worker` processes, one killed with SIGKILL and replaced SOAK_TASK_KILLS times at random
# moments while tasks run, on MariaDB and PostgreSQL: 0 lost, no two tasks of an entity
# overlapping, submission order kept, duplicate effects at most kills x --concurrency and
# printed (its short version, 4 kills over 240 tasks, runs in `make test`).
SOAK_TASKS ?= 20000
SOAK_TASK_KILLS ?= 100
SOAK_TESTS ?= tests/guarantees/test_soak.py tests/guarantees/test_soak_skew.py tests/guarantees/test_soak_tasks.py

.PHONY: soak
soak: install  ## long fault injection: 100 crash iterations per database (and 100 more with a 3 s lease and 30% of heartbeats failing, and 100 with a skewed clock and lost replies; 100 kill -9 of task workers over 20,000 tasks), 1M users with 1% temporary failures (MariaDB)
	BATCHRUN_SOAK=1 BATCHRUN_SOAK_ITERATIONS=$(SOAK_ITERATIONS) BATCHRUN_SOAK_USERS=$(SOAK_USERS) \
	BATCHRUN_SOAK_ALL_IN_MONTH=$(SOAK_ALL_IN_MONTH) BATCHRUN_SOAK_LEASE_S=$(SOAK_LEASE_S) \
	BATCHRUN_SOAK_HEARTBEAT_FAIL=$(SOAK_HEARTBEAT_FAIL) BATCHRUN_SOAK_SKEW=$(SOAK_SKEW) \
	BATCHRUN_SOAK_SKEW_LEASE_S=$(SOAK_SKEW_LEASE_S) BATCHRUN_SOAK_DROP_CHANCE=$(SOAK_DROP_CHANCE) \
	BATCHRUN_SOAK_TASKS=$(SOAK_TASKS) BATCHRUN_SOAK_TASK_KILLS=$(SOAK_TASK_KILLS) \
	$(BIN)/python -m pytest $(SOAK_TESTS) -v -s -rA
