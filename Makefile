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

## Lint, type check, then every test (unit, engine on real vLLM, cluster skips without one).
test: setup check
	$(BIN)/pytest -q -ra

check:
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	scripts/kube-plane check

unit:
	$(BIN)/pytest -q tests/unit

engine:
	$(BIN)/pytest -q -ra tests/engine
