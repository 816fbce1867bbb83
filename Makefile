# The two commands a newcomer needs (README): `make run` and `make test`.
# Each one sets up everything first (scripts/setup.sh is idempotent).
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup run test check unit engine

setup:
	scripts/setup.sh

## The main job: up -> completion -> down on the built-in tiny PD recipe (vLLM CPU build).
run: setup
	$(BIN)/servebook run

## Lint, type check, then every test: unit (3 processes: they mostly wait; those whose
## figures are timings, marked serial, alone), then the engine and cluster tests one at a
## time (real vLLM servers and the test plane share 2 cores).
test: setup check
	$(BIN)/pytest -q -ra -n 3 -m "not serial" tests/unit
	$(BIN)/pytest -q -ra -m serial tests/unit
	$(BIN)/pytest -q -ra --durations=25 tests/engine tests/cluster

check:
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	scripts/kube-plane check

unit:
	$(BIN)/pytest -q -n 3 -m "not serial" tests/unit
	$(BIN)/pytest -q -m serial tests/unit

engine:
	$(BIN)/pytest -q -ra tests/engine
