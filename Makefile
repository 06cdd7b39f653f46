# Two commands do all set-up on a fresh machine:
#   make run    set up .venv, then run the main job (configs/quickstart.yaml)
#   make test   set up .venv, then run the test suite
PY := .venv/bin/python
CONFIG ?= configs/quickstart.yaml
PYTEST_ARGS ?=
# The suite runs on every core (pytest-xdist; tests/conftest.py groups the tests that share a
# module's fixture); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= auto

.PHONY: setup run test bench clean

setup:
	@bash scripts/bootstrap.sh

run: setup
	@$(PY) -m tff_fedadamom run $(CONFIG)

test: setup
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Every benchmark, each rewriting its own section of benchmarks/RESULTS.md. Long: run it on an
# otherwise idle machine.
bench: setup
	@$(PY) -m benchmarks.optimizer_step
	@$(PY) -m benchmarks.rounds
	@$(PY) -m benchmarks.sweeps

clean:
	rm -rf .venv runs
