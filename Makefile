# pflrepro — run `make help` for the targets.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
export WANDB_MODE ?= offline

.PHONY: help setup demo test lint bench clean-runs

help:
	@echo "make setup   create $(VENV) and install pflrepro with its dev tools (torch from pip)"
	@echo "make demo    FedAvg / Local / FedProx on embedded digits -> results/demo/ (a few minutes)"
	@echo "make test    the test suite (WANDB_MODE=offline)"
	@echo "make lint    ruff"
	@echo "make bench   engine vs naive loop, seconds per round -> results/bench/"

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Debian/Ubuntu: apt-get install python3.11 python3.11-venv)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) scripts/demo.py --out results/demo

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) scripts/benchmark.py --out results/bench

clean-runs:
	rm -rf runs cache results/demo/runs
